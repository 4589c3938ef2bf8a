"""The chart's files without helm: the CRD and rules copies, the operator's RBAC rules, the values
file (every key commented, valid against values.schema.json) and the schema itself (closed objects,
so a typo is an error), and the CRD's field descriptions (what ``kubectl explain`` shows)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml
from chart_support import CHART, ROOT

# -- copies -------------------------------------------------------------------------------------


def test_chart_crds_are_byte_identical_copies() -> None:
    sources = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    copies = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert sources and sources == copies
    for name in sources:
        assert (CHART / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
            f"charts/sluiceway/crds/{name} differs from crds/{name}: cp crds/*.yaml charts/sluiceway/crds/"
        )


def test_chart_prometheus_rules_are_a_byte_identical_copy() -> None:
    source = ROOT / "operator" / "sluiceway_scaler" / "rules.yaml"
    copy = CHART / "files" / "scaler-rules.yaml"
    assert copy.read_bytes() == source.read_bytes(), (
        "charts/sluiceway/files/scaler-rules.yaml differs: cp operator/sluiceway_scaler/rules.yaml "
        "charts/sluiceway/files/scaler-rules.yaml"
    )


# -- RBAC rules ---------------------------------------------------------------------------------


def _operator_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
    return rules


def test_operator_rules_are_least_privilege() -> None:
    rules = _operator_rules()
    verbs = {v for r in rules for v in r["verbs"]}
    resources = {res for r in rules for res in r["resources"]}
    assert "*" not in verbs and "*" not in resources
    assert not verbs & {"escalate", "bind", "impersonate", "deletecollection"}
    secrets = [r for r in rules if "secrets" in r["resources"]]
    assert secrets
    # get (key Secrets by name), list + watch (the tenant-key watch, label-selected by the operator),
    # create + patch (its own Secrets); never update or delete
    for r in secrets:
        assert set(r["verbs"]) == {"get", "list", "watch", "create", "patch"}, r


def test_only_crd_reads_are_cluster_scoped() -> None:
    """The template splits the rules: apiextensions (cluster-scoped) stay in the ClusterRole when
    namespaces are set; everything else must be namespaced so a Role can grant it."""
    cluster = [r for r in _operator_rules() if "apiextensions.k8s.io" in r["apiGroups"]]
    assert cluster == [
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get"]}
    ]
    for r in _operator_rules():
        if r not in cluster:
            assert "apiextensions.k8s.io" not in r["apiGroups"]
            assert not set(r["resources"]) & {"namespaces", "nodes", "customresourcedefinitions"}, r


# -- values and schema --------------------------------------------------------------------------

#: Keys whose children are Kubernetes API fields (documented there), not chart settings.
K8S_PASSTHROUGH = {
    "podSecurityContext",
    "securityContext",
    "resources",
    "namespaceSelector",
    "podSelector",
    "kedaNamespaceSelector",
    "labels",
}


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load((CHART / "values.schema.json").read_text())
    return schema


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def test_values_validate_against_the_schema() -> None:
    jsonschema.Draft7Validator.check_schema(_schema())
    assert _schema()["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator(_schema()).validate(_values())


def test_every_value_key_is_commented() -> None:
    """Each key has a comment on the line(s) right above it or on its own line."""
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    undocumented: list[str] = []

    def walk(node: yaml.Node, path: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            here = f"{path}.{key.value}" if path else str(key.value)
            line = key.start_mark.line
            above = lines[line - 1].strip() if line > 0 else ""
            inline = "#" in lines[line][key.start_mark.column :]
            if not node.flow_style and not (above.startswith("#") or inline):
                undocumented.append(here)  # keys of a {flow: map} share their parent's comment
            if key.value not in K8S_PASSTHROUGH:
                walk(value, here)

    walk(yaml.compose(text), "")
    assert undocumented == []


def _closed_objects(schema: Any, path: str = "") -> list[str]:
    """Paths of object schemas that accept unknown keys (no ``additionalProperties`` constraint)."""
    open_paths: list[str] = []
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "additionalProperties" not in schema:
            open_paths.append(path or "/")
        for key, sub in schema.items():
            if key in ("properties", "definitions"):
                for name, s in sub.items():
                    open_paths += _closed_objects(s, f"{path}/{name}")
            elif key in ("items", "additionalProperties"):
                open_paths += _closed_objects(sub, f"{path}/{key}")
            elif key in ("oneOf", "anyOf", "allOf"):
                for n, s in enumerate(sub):
                    open_paths += _closed_objects(s, f"{path}/{key}{n}")
    return open_paths


def test_schema_objects_are_closed() -> None:
    """additionalProperties everywhere: false for settings, a value schema for maps. The only open
    objects are Kubernetes passthroughs whose inner schema is the API server's (affinity terms)
    and Helm's own ``global``."""
    allowed = {
        "/global",
        "/operator/affinity/nodeAffinity",
        "/operator/affinity/podAffinity",
        "/operator/affinity/podAntiAffinity",
        "/scaler/affinity/nodeAffinity",
        "/scaler/affinity/podAffinity",
        "/scaler/affinity/podAntiAffinity",
    }
    assert set(_closed_objects(_schema())) <= allowed


def _schema_keys(schema: dict[str, Any], path: str = "") -> set[str]:
    out: set[str] = set()
    for name, sub in (schema.get("properties") or {}).items():
        here = f"{path}.{name}" if path else name
        out.add(here)
        if name not in K8S_PASSTHROUGH and name != "affinity":
            out |= _schema_keys(sub, here)
    return out


def _value_keys(values: Any, path: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(values, dict):
        for name, sub in values.items():
            here = f"{path}.{name}" if path else name
            out.add(here)
            if name not in K8S_PASSTHROUGH:
                out |= _value_keys(sub, here)
    return out


def test_schema_and_values_name_the_same_keys() -> None:
    """No setting documented in one and missing from the other (global is Helm's)."""
    assert _schema_keys(_schema()) - {"global"} == _value_keys(_values())


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"operater": {}}, "Additional properties are not allowed ('operater' was unexpected)"),
        ({"operator": {"namespace": ["a"]}}, "'namespace' was unexpected"),
        ({"scaler": {"port": "9090"}}, "'9090' is not of type 'integer'"),
        ({"scaler": {"allowedPrometheusUrls": "http://p:9090"}}, "is not of type 'array'"),
        ({"operator": {"logFormat": "xml"}}, "'xml' is not one of ['', 'plain', 'full', 'json']"),
        ({"image": {"digest": "latest"}}, "does not match"),
        ({"operator": {"prometheusUrl": "prometheus:9090"}}, "is not valid under any of the given schemas"),
        ({"scaler": {"tls": {"enabled": "yes"}}}, "'yes' is not of type 'boolean'"),
        ({"operator": {"resources": {"requests": {"cpu": "lots"}}}}, "is not valid under any of the given schemas"),
    ],
)
def test_schema_rejects_typos_and_wrong_types(patch: dict[str, Any], message: str) -> None:
    values = _merge(_values(), patch)
    errors = [e.message for e in jsonschema.Draft7Validator(_schema()).iter_errors(values)]
    assert any(message in e for e in errors), errors


def _merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base.get(k), v) if k in base else v
        return out
    return patch


# -- the CRD as `kubectl explain` shows it ------------------------------------------------------


def _undescribed(node: dict[str, Any], path: str) -> list[str]:
    missing: list[str] = []
    for name, sub in (node.get("properties") or {}).items():
        here = f"{path}.{name}"
        if not str(sub.get("description") or "").strip():
            missing.append(here)
        missing += _undescribed(sub, here)
    if isinstance(node.get("items"), dict):
        missing += _undescribed(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        missing += _undescribed(node["additionalProperties"], f"{path}{{}}")
    return missing


def test_every_crd_spec_field_has_a_description() -> None:
    """``kubectl explain infsvc.spec --recursive`` shows each field's description: none is empty."""
    crd = yaml.safe_load((ROOT / "crds" / "inferenceservices.sluiceway.io.yaml").read_text())
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        assert str(schema["properties"]["spec"].get("description") or "").strip()
        assert _undescribed(schema["properties"]["spec"], "spec") == []


def test_http_routes_are_a_namespaced_child_without_list_or_watch() -> None:
    """Issue 19 §3: the HTTPRoute <name>-gateway is applied, read and pruned by name like the other
    children: get/create/patch/delete, in the namespaced rules (a Role per watched namespace with
    operator.namespaces), never list/watch, never cluster-wide."""
    routes = [r for r in _operator_rules() if "httproutes" in r["resources"]]
    assert routes == [
        {
            "apiGroups": ["gateway.networking.k8s.io"],
            "resources": ["httproutes"],
            "verbs": ["get", "create", "patch", "delete"],
        }
    ]
