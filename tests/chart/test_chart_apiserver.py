"""The chart installed for real: ``helm install`` / ``helm upgrade`` into a real kube-apiserver
(RBAC on; tests/operator/kubetools.py), SubjectAccessReviews for the chart's ServiceAccount (what the
operator may and may not do, namespaced and cluster-wide), the real operator running under exactly
the chart's RBAC, and every sample applied to the API server (CRD schema + CEL) and rendered."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import ALL_ON, CHART, SAMPLES, helm_binary, run_helm, sample_documents, write_values
from kubetools import Admin, ControlPlane, establish_crd, run_operator, wait_for, write_kubeconfig
from sluiceway_core.keys import hash_key, new_salt
from sluiceway_operator.kube import ApiError, Kube
from sluiceway_operator.render import Environment, Owner, render
from sluiceway_operator.spec import parse_spec

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

RELEASE_NS = "sluiceway-system"
WATCHED = ("team-a", "team-b")
OTHER = "elsewhere"
SA_USER = f"system:serviceaccount:{RELEASE_NS}:sluiceway-operator"
SA_GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{RELEASE_NS}", "system:authenticated"]
NAMESPACED = {"operator": {"namespaces": list(WATCHED), "prometheusUrl": "http://prometheus.monitoring.svc:9090"}}

#: The per-service salt the operator keeps in the keys Secret (sluiceway_core.keys).
SALT = new_salt()


def _standin_crd(plural: str, kind: str, group: str, version: str, scope: str = "Namespaced") -> dict[str, Any]:
    """A CRD that accepts any object of a kind this chart renders but whose operator is absent."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def helm() -> str:
    path, why = helm_binary()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> Admin:
    a = Admin(Kube(control_plane.client()))
    for ns in (*WATCHED, OTHER, "demo"):
        if a.get(f"/api/v1/namespaces/{ns}") is None:
            a.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    return a


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-install")


def _helm(helm: str, home: Path, control_plane: ControlPlane, *args: str) -> str:
    out = run_helm(helm, home, *args, "--kubeconfig", str(control_plane.kubeconfig), timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def installed(helm: str, home: Path, control_plane: ControlPlane, admin: Admin) -> Iterator[str]:
    """The chart installed watching team-a and team-b (revision 1). Mutual TLS is on by default: the
    chart's ClusterTriggerAuthentication needs KEDA's CRD (a stand-in here) and the generated KEDA
    client Secret goes to KEDA's namespace, so both exist first, as after installing KEDA."""
    if admin.get("/api/v1/namespaces/keda") is None:
        admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "keda"}})
    cta = _standin_crd(
        "clustertriggerauthentications", "ClusterTriggerAuthentication", "keda.sh", "v1alpha1", "Cluster"
    )
    if admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{cta['metadata']['name']}") is None:
        admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", cta)
    wait_for(
        lambda: admin.get("/apis/keda.sh/v1alpha1/clustertriggerauthentications") is not None,
        30,
        what="clustertriggerauthentications served",
    )
    values = write_values(home / "namespaced.yaml", NAMESPACED)
    out = _helm(
        helm,
        home,
        control_plane,
        "install",
        "sluiceway",
        str(CHART),
        "-n",
        RELEASE_NS,
        "--create-namespace",
        "-f",
        str(values),
    )
    establish_crd(admin, yaml.safe_load((CHART / "crds" / "inferenceservices.sluiceway.io.yaml").read_text()))
    yield out


def _can(
    admin: Admin, verb: str, resource: str, namespace: str = "", group: str = "", sub: str = "", name: str = ""
) -> bool:
    attrs = {"verb": verb, "resource": resource, "group": group, "namespace": namespace}
    if sub:
        attrs["subresource"] = sub
    if name:
        attrs["name"] = name
    review = admin.create(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": SA_USER, "groups": SA_GROUPS, "resourceAttributes": attrs},
        },
    )
    return bool(review["status"].get("allowed"))


#: (verb, resource, group, subresource) the operator needs in every namespace it watches.
NEEDED = [
    ("get", "secrets", "", ""),
    ("create", "secrets", "", ""),
    ("patch", "secrets", "", ""),
    # the watch on tenant-key Secrets (labelled sluiceway.io/tenant-key; the selector is the operator's)
    ("list", "secrets", "", ""),
    ("watch", "secrets", "", ""),
    ("patch", "configmaps", "", ""),
    ("patch", "services", "", ""),
    ("patch", "deployments", "apps", ""),
    ("patch", "poddisruptionbudgets", "policy", ""),
    ("patch", "scaledobjects", "keda.sh", ""),
    ("patch", "servicemonitors", "monitoring.coreos.com", ""),
    ("list", "inferenceservices", "sluiceway.io", ""),
    ("watch", "inferenceservices", "sluiceway.io", ""),
    ("patch", "inferenceservices", "sluiceway.io", ""),
    ("patch", "inferenceservices", "sluiceway.io", "status"),
    ("create", "events", "", ""),
    # spec.gateway: its ServiceAccount, Role and RoleBinding; EndpointSlice reads, which the Role grants
    ("patch", "serviceaccounts", "", ""),
    ("create", "roles", "rbac.authorization.k8s.io", ""),
    ("patch", "rolebindings", "rbac.authorization.k8s.io", ""),
    ("list", "endpointslices", "discovery.k8s.io", ""),
    ("watch", "endpointslices", "discovery.k8s.io", ""),
    # spec.model.storageUri: the storage initializers' states (ModelFetched)
    ("list", "pods", "", ""),
    # spec.gateway.httpRoute: the HTTPRoute <name>-gateway, applied, read back and pruned by name
    ("get", "httproutes", "gateway.networking.k8s.io", ""),
    ("patch", "httproutes", "gateway.networking.k8s.io", ""),
    ("delete", "httproutes", "gateway.networking.k8s.io", ""),
]
#: Never, anywhere. The operator creates RoleBindings (the gateway's) but can grant only what it
#: holds itself: no bind, no escalate (test_operator_cannot_grant_more_than_it_holds).
NEVER = [
    ("update", "secrets", "", ""),
    ("delete", "secrets", "", ""),
    ("deletecollection", "secrets", "", ""),
    ("create", "pods", "", ""),
    ("delete", "inferenceservices", "sluiceway.io", ""),
    ("escalate", "roles", "rbac.authorization.k8s.io", ""),
    ("escalate", "clusterroles", "rbac.authorization.k8s.io", ""),
    ("bind", "roles", "rbac.authorization.k8s.io", ""),
    ("bind", "clusterroles", "rbac.authorization.k8s.io", ""),
    ("create", "clusterrolebindings", "rbac.authorization.k8s.io", ""),
    ("create", "clusterroles", "rbac.authorization.k8s.io", ""),
    # the operator neither lists nor watches HTTPRoutes (issue 19 §3: its own, by name)
    ("list", "httproutes", "gateway.networking.k8s.io", ""),
    ("watch", "httproutes", "gateway.networking.k8s.io", ""),
]


def test_install_creates_the_release(installed: str, admin: Admin) -> None:
    assert "STATUS: deployed" in installed and "REVISION: 1" in installed
    notes = installed.split("NOTES:", 1)[1]
    assert "kubectl apply -f samples/demo-cpu.yaml" in notes
    assert "kubectl -n sluiceway-system rollout status deployment/sluiceway-operator" in notes
    assert "watching namespaces team-a, team-b" in notes
    assert "WARNING" not in notes  # operator.prometheusUrl is set
    assert "mutual TLS from Secret sluiceway-scaler-tls (generated; KEDA's client certificate in keda/" in notes
    crd = admin.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/inferenceservices.sluiceway.io")
    assert crd is not None
    for kind, path in (
        ("Deployment", f"/apis/apps/v1/namespaces/{RELEASE_NS}/deployments/sluiceway-operator"),
        ("Deployment", f"/apis/apps/v1/namespaces/{RELEASE_NS}/deployments/sluiceway-scaler"),
        ("Service", f"/api/v1/namespaces/{RELEASE_NS}/services/sluiceway-scaler"),
        ("ServiceAccount", f"/api/v1/namespaces/{RELEASE_NS}/serviceaccounts/sluiceway-operator"),
        ("Role", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles/sluiceway-operator"),
    ):
        obj = admin.get(path)
        assert obj is not None, path
        assert obj["kind"] == kind
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "sluiceway"


def test_namespaced_rbac_by_subject_access_review(installed: str, admin: Admin) -> None:
    denied_needed = [(v, r, ns, s) for ns in WATCHED for v, r, g, s in NEEDED if not _can(admin, v, r, ns, g, s)]
    assert denied_needed == []
    assert _can(admin, "get", "customresourcedefinitions", group="apiextensions.k8s.io", name="scaledobjects.keda.sh")
    # Nothing outside the watched namespaces, Secrets above all; nothing cluster-wide.
    for ns in (OTHER, RELEASE_NS, "kube-system"):
        for verb in ("get", "list", "watch", "create", "patch", "delete"):
            assert not _can(admin, verb, "secrets", ns), (verb, ns)
        assert not _can(admin, "patch", "deployments", ns, "apps"), ns
        for verb, resource, group in (
            ("create", "rolebindings", "rbac.authorization.k8s.io"),
            ("create", "roles", "rbac.authorization.k8s.io"),
            ("create", "serviceaccounts", ""),
            ("list", "endpointslices", "discovery.k8s.io"),
            ("patch", "httproutes", "gateway.networking.k8s.io"),
        ):
            assert not _can(admin, verb, resource, ns, group), (verb, resource, ns)
    for verb in ("get", "list", "watch"):
        assert not _can(admin, verb, "secrets"), verb  # all namespaces
    assert not _can(admin, "list", "inferenceservices", group="sluiceway.io")
    for ns in (*WATCHED, OTHER):
        for v, r, g, s in NEVER:
            assert not _can(admin, v, r, ns, g, s), (v, r, ns)
    assert not _can(admin, "delete", "customresourcedefinitions", group="apiextensions.k8s.io")


def _operator_kubeconfig(control_plane: ControlPlane, admin: Admin) -> Path:
    token = admin.create(
        f"/api/v1/namespaces/{RELEASE_NS}/serviceaccounts/sluiceway-operator/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )["status"]["token"]
    path = control_plane.workdir / "chart-operator.kubeconfig"
    write_kubeconfig(path, control_plane.server, token)
    return path


def _demo_in(namespace: str) -> dict[str, Any]:
    cr: dict[str, Any] = yaml.safe_load((SAMPLES / "demo-cpu.yaml").read_text())
    cr["metadata"]["namespace"] = namespace
    return cr


def test_operator_runs_under_the_charts_namespaced_rbac(
    installed: str, admin: Admin, control_plane: ControlPlane
) -> None:
    """The real operator, with the token of the chart's ServiceAccount, reconciles a sample in a
    watched namespace (no 403 in its log: run_operator checks) and cannot touch another one."""
    kubeconfig = _operator_kubeconfig(control_plane, admin)
    log = control_plane.workdir / "chart-operator.log"
    with run_operator(kubeconfig, log, WATCHED[0], "-n", WATCHED[1], "--drift-interval", "5"):
        admin.create(f"/apis/sluiceway.io/v1alpha1/namespaces/{WATCHED[0]}/inferenceservices", _demo_in(WATCHED[0]))
        deployment = wait_for(
            lambda: admin.get(f"/apis/apps/v1/namespaces/{WATCHED[0]}/deployments/demo"),
            60,
            what="the operator's Deployment for the demo sample",
        )
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
            "ghcr.io/sluiceway/sluiceway-pod:"
        )
        wait_for(lambda: admin.get(f"/api/v1/namespaces/{WATCHED[0]}/secrets/demo-keys"), 30, what="keys Secret")

        def config_valid() -> Any:
            obj = admin.get(f"/apis/sluiceway.io/v1alpha1/namespaces/{WATCHED[0]}/inferenceservices/demo")
            conds = (obj or {}).get("status", {}).get("conditions") or []
            return [c for c in conds if c["type"] == "ConfigValid" and c["status"] == "True"]

        wait_for(config_valid, 60, what="ConfigValid=True")
        # A namespace the chart does not grant: the operator is not watching it, nothing appears.
        admin.create(f"/apis/sluiceway.io/v1alpha1/namespaces/{OTHER}/inferenceservices", _demo_in(OTHER))
        time.sleep(3)
        assert admin.get(f"/apis/apps/v1/namespaces/{OTHER}/deployments/demo") is None


def test_operator_cannot_grant_more_than_it_holds(installed: str, admin: Admin, control_plane: ControlPlane) -> None:
    """The operator may create Roles and RoleBindings (the gateway's), yet the API server's
    escalation check stops it granting what it does not hold: a RoleBinding to the ``admin``
    ClusterRole, or a Role that deletes Secrets, is forbidden in a namespace it watches; the gateway's
    Role (EndpointSlice reads) is allowed."""
    operator = Admin(Kube(control_plane.client(_operator_kubeconfig(control_plane, admin))))
    ns = WATCHED[0]
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    grab_admin = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "grab-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
    }
    delete_secrets = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "delete-secrets"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["delete"]}],
    }
    for path, body in ((f"{rbac}/rolebindings", grab_admin), (f"{rbac}/roles", delete_secrets)):
        with pytest.raises(ApiError) as info:
            operator.create(path, body, dry_run=True)
        assert info.value.status == 403, body["metadata"]["name"]
    gateway_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "gateway-like"},
        "rules": [
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
        ],
    }
    assert operator.create(f"{rbac}/roles", gateway_role, dry_run=True)["metadata"]["name"] == "gateway-like"


def _kind_path(doc: dict[str, Any]) -> str:
    ns = doc["metadata"].get("namespace", "default")
    paths = {
        "Namespace": "/api/v1/namespaces",
        "Secret": f"/api/v1/namespaces/{ns}/secrets",
        "ConfigMap": f"/api/v1/namespaces/{ns}/configmaps",
        "InferenceService": f"/apis/sluiceway.io/v1alpha1/namespaces/{ns}/inferenceservices",
    }
    assert doc["kind"] in paths, f"samples hold {sorted(paths)}, not {doc['kind']}"
    return paths[doc["kind"]]


@pytest.mark.parametrize("filename", sorted(sample_documents()))
def test_sample_is_accepted_by_the_api_server_and_renders(installed: str, admin: Admin, filename: str) -> None:
    docs = sample_documents()[filename]
    keys: dict[tuple[str, str], str] = {}
    for doc in docs:
        if doc["kind"] == "Namespace" and admin.get(f"/api/v1/namespaces/{doc['metadata']['name']}"):
            continue
        created = admin.create(_kind_path(doc), copy.deepcopy(doc))
        assert created["metadata"]["uid"]
        if doc["kind"] == "Secret":
            for k, v in doc["stringData"].items():
                keys[(doc["metadata"]["name"], k)] = v
    for doc in docs:
        if doc["kind"] != "InferenceService":
            continue
        meta = doc["metadata"]
        stored = admin.get(f"{_kind_path(doc)}/{meta['name']}")
        # What the operator sees: the API server's defaults applied.
        spec = parse_spec(stored["spec"])
        hashes = {
            t.name: hash_key(keys[(t.key_secret_ref.name, t.key_secret_ref.key)], SALT)
            for t in spec.keyed_tenants
            if t.key_secret_ref is not None
        }
        env = Environment(prometheus_url="http://prometheus.monitoring.svc:9090", keda=True, service_monitor=True)
        owner = Owner(meta["name"], meta["namespace"], stored["metadata"]["uid"])
        rendered = render(owner, spec, hashes, env, salt=SALT, edge_token="sample-edge-token-" + "0" * 46)
        # Server-side dry run of the core children: the API server accepts what the operator renders.
        for manifest in rendered.manifests:
            if manifest["apiVersion"] in ("keda.sh/v1alpha1", "monitoring.coreos.com/v1"):
                continue
            plural = {
                "ConfigMap": "configmaps",
                "Secret": "secrets",
                "Service": "services",
                "Deployment": "deployments",
                "PodDisruptionBudget": "poddisruptionbudgets",
                "ServiceAccount": "serviceaccounts",
                "Role": "roles",
                "RoleBinding": "rolebindings",
                "NetworkPolicy": "networkpolicies",
            }[manifest["kind"]]
            prefix = "/api/v1" if manifest["apiVersion"] == "v1" else f"/apis/{manifest['apiVersion']}"
            admin.create(f"{prefix}/namespaces/{meta['namespace']}/{plural}", manifest, dry_run=True)


def test_upgrade_to_clusterwide_with_every_feature(
    helm: str, home: Path, control_plane: ControlPlane, admin: Admin, installed: str
) -> None:
    """helm upgrade (revision 2): cluster-wide RBAC (Roles removed), monitoring objects, policies."""
    standins = [
        _standin_crd("prometheusrules", "PrometheusRule", "monitoring.coreos.com", "v1"),
        _standin_crd("podmonitors", "PodMonitor", "monitoring.coreos.com", "v1"),
        _standin_crd("servicemonitors", "ServiceMonitor", "monitoring.coreos.com", "v1"),
    ]  # the ClusterTriggerAuthentication stand-in is there since the install (mutual TLS is the default)
    for crd in standins:
        if admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}") is None:
            admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    for plural in ("prometheusrules", "podmonitors", "servicemonitors"):
        wait_for(
            lambda p=plural: admin.get(f"/apis/monitoring.coreos.com/v1/namespaces/{RELEASE_NS}/{p}") is not None,
            30,
            what=f"{plural} served",
        )
    values = copy.deepcopy(ALL_ON)
    values["operator"]["namespaces"] = []
    values["networkPolicy"]["inferencePods"] = {"namespaces": list(WATCHED)}
    path = write_values(home / "clusterwide.yaml", values)
    out = _helm(helm, home, control_plane, "upgrade", "sluiceway", str(CHART), "-n", RELEASE_NS, "-f", str(path))
    assert "REVISION: 2" in out
    status = json.loads(_helm(helm, home, control_plane, "status", "sluiceway", "-n", RELEASE_NS, "-o", "json"))
    assert status["info"]["status"] == "deployed" and status["version"] == 2
    # The Roles are gone, the ClusterRole carries every rule.
    for ns in WATCHED:
        wait_for(
            lambda n=ns: (
                admin.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{n}/roles/sluiceway-operator") is None
            ),
            30,
            what=f"Role in {ns} removed",
        )
    for v, r, g, s in NEEDED:
        assert _can(admin, v, r, OTHER, g, s), (v, r)
    for ns in (OTHER, ""):
        for v, r, g, s in NEVER:
            assert not _can(admin, v, r, ns, g, s), (v, r, ns)
    # The monitoring objects exist.
    assert admin.get(f"/apis/monitoring.coreos.com/v1/namespaces/{RELEASE_NS}/prometheusrules/sluiceway")
    assert admin.get(f"/apis/monitoring.coreos.com/v1/namespaces/{RELEASE_NS}/podmonitors/sluiceway-inference-pods")
    assert admin.get(f"/apis/monitoring.coreos.com/v1/namespaces/{RELEASE_NS}/servicemonitors/sluiceway-scaler")
    assert admin.get(f"/apis/networking.k8s.io/v1/namespaces/{WATCHED[0]}/networkpolicies/sluiceway-inference-pods")
    scaler = admin.get(f"/apis/apps/v1/namespaces/{RELEASE_NS}/deployments/sluiceway-scaler")
    assert "--tls-cert" in scaler["spec"]["template"]["spec"]["containers"][0]["args"]
    cta = admin.get("/apis/keda.sh/v1alpha1/clustertriggerauthentications/sluiceway-scaler")
    assert cta is not None and cta["spec"]["secretTargetRef"][0]["name"] == ALL_ON["scaler"]["tls"]["kedaClientSecret"]


def _secret_data(admin: Admin, namespace: str, name: str) -> dict[str, str]:
    secret = admin.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
    assert secret is not None, f"{namespace}/{name}"
    data: dict[str, str] = secret["data"]
    return data


def test_generated_secrets_survive_upgrades(
    helm: str, home: Path, control_plane: ControlPlane, admin: Admin, installed: str
) -> None:
    """The quota key and the generated mutual TLS material are read back with `lookup` on every
    upgrade: a new key would orphan every signed charter, new certificates would cut KEDA off."""
    values = copy.deepcopy(ALL_ON)
    values["operator"]["namespaces"] = []
    values["networkPolicy"]["inferencePods"] = {"namespaces": list(WATCHED)}
    values["scaler"]["tls"] = {"enabled": True}  # generated by the chart
    path = write_values(home / "generated.yaml", values)
    seen = []
    for _ in range(2):
        _helm(helm, home, control_plane, "upgrade", "sluiceway", str(CHART), "-n", RELEASE_NS, "-f", str(path))
        seen.append(
            (
                _secret_data(admin, RELEASE_NS, "sluiceway-quota-key"),
                _secret_data(admin, RELEASE_NS, "sluiceway-scaler-tls"),
                _secret_data(admin, "keda", "sluiceway-keda-client"),
            )
        )
    assert seen[0] == seen[1]
    quota_key, server, client = seen[0]
    assert len(quota_key["key"]) > 40 and server["ca.crt"] == client["ca.crt"]
    cta = admin.get("/apis/keda.sh/v1alpha1/clustertriggerauthentications/sluiceway-scaler")
    assert cta is not None and {r["name"] for r in cta["spec"]["secretTargetRef"]} == {"sluiceway-keda-client"}
    scaler = admin.get(f"/apis/apps/v1/namespaces/{RELEASE_NS}/deployments/sluiceway-scaler")
    assert scaler is not None and scaler["spec"]["strategy"]["type"] == "Recreate"


def test_crd_upgrade_needs_server_side_apply_with_force_conflicts(
    installed: str, control_plane: ControlPlane, admin: Admin, tmp_path: Path
) -> None:
    """Helm creates the CRD from crds/ on install (field manager ``helm``, operation Update) and never
    upgrades it. The next chart version's CRD applied with ``kubectl apply --server-side`` conflicts
    with Helm's fields; with ``--force-conflicts`` (docs/install.md) it takes them over. Debian's
    kubectl (a client, not built here) against the real API server."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl on PATH (Debian's kubernetes-client)")
    crd_path = CHART / "crds" / "inferenceservices.sluiceway.io.yaml"
    name = "inferenceservices.sluiceway.io"
    live = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    assert live is not None
    assert "helm" in {m["manager"] for m in live["metadata"].get("managedFields", [])}, live["metadata"]
    nxt = yaml.safe_load(crd_path.read_text())
    schema = nxt["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["description"] = "the next chart version's CRD"
    (tmp_path / "crds").mkdir()
    (tmp_path / "crds" / crd_path.name).write_text(yaml.safe_dump(nxt))

    def kubectl_apply(*flags: str, directory: Path) -> subprocess.CompletedProcess[str]:
        cmd = [kubectl, "--kubeconfig", str(control_plane.kubeconfig), "apply", "--server-side", *flags]
        return subprocess.run([*cmd, "-f", str(directory)], capture_output=True, text=True, timeout=60, check=False)

    plain = kubectl_apply(directory=tmp_path / "crds")
    assert plain.returncode != 0 and "conflict" in plain.stderr.lower(), plain.stdout + plain.stderr
    forced = kubectl_apply("--force-conflicts", directory=tmp_path / "crds")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    live = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    assert live is not None
    assert live["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] == "the next chart version's CRD"
    # back to this version's CRD, the same documented command
    back = kubectl_apply("--force-conflicts", directory=CHART / "crds")
    assert back.returncode == 0, back.stdout + back.stderr
    establish_crd(admin, yaml.safe_load(crd_path.read_text()))


def test_install_with_a_bad_value_fails_clearly(helm: str, home: Path, control_plane: ControlPlane) -> None:
    out = run_helm(
        helm,
        home,
        "install",
        "typo",
        str(CHART),
        "-n",
        "typo",
        "--create-namespace",
        "--set",
        "scaler.prot=9090",
        "--kubeconfig",
        str(control_plane.kubeconfig),
    )
    assert out.returncode != 0
    assert "at '/scaler': additional properties 'prot' not allowed" in out.stderr, out.stderr


def test_explain_shows_a_description_for_every_spec_field(installed: str, admin: Admin) -> None:
    """What ``kubectl explain infsvc.spec --recursive`` reads: the API server's published OpenAPI v3
    document for sluiceway.io/v1alpha1. Every field under spec has a non-empty description."""
    doc = admin.get("/openapi/v3/apis/sluiceway.io/v1alpha1")
    assert doc is not None
    schemas = doc["components"]["schemas"]
    root = next(s for name, s in schemas.items() if name.endswith(".InferenceService"))
    spec = root["properties"]["spec"]
    missing: list[str] = []
    seen = 0

    def walk(node: dict[str, Any], path: str) -> None:
        nonlocal seen
        for ref in node.get("allOf") or []:
            walk(schemas[ref["$ref"].rsplit("/", 1)[1]], path)
        for name, sub in (node.get("properties") or {}).items():
            seen += 1
            if not str(sub.get("description") or "").strip():
                missing.append(f"{path}.{name}")
            walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(spec, "spec")
    assert seen > 50, f"only {seen} fields published under spec"
    assert missing == []
