"""samples/: each InferenceService renders through the operator's pure ``render()`` into manifests
that pass kubernetes-validate; the set covers what the README and docs promise; the README's quick
start runs exactly these files (no inline YAML to drift). Applying them to a real API server is in
test_chart_apiserver.py."""

from __future__ import annotations

import re
import shlex
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chart_support import CHART, K8S_VERSION, ROOT, sample_documents
from sluiceway_core.keys import hash_key, new_salt
from sluiceway_operator.render import Environment, Owner, render
from sluiceway_operator.spec import parse_spec

SAMPLES_DOCS = sample_documents()
ENV = Environment(
    scaler_address="sluiceway-scaler.sluiceway-system.svc:9090",
    prometheus_url="http://prometheus.monitoring.svc:9090",
    keda=True,
    service_monitor=True,
)

#: The per-service salt the operator keeps in the keys Secret (sluiceway_core.keys).
SALT = new_salt()


def _services() -> list[tuple[str, dict[str, Any]]]:
    return [(f, d) for f, docs in SAMPLES_DOCS.items() for d in docs if d["kind"] == "InferenceService"]


def _secret_value(docs: list[dict[str, Any]], name: str, key: str) -> str:
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name)
    value: str = secret["stringData"][key]
    return value


@pytest.mark.parametrize(("filename", "cr"), _services(), ids=[f for f, _ in _services()])
def test_sample_renders_valid_children(filename: str, cr: dict[str, Any]) -> None:
    spec = parse_spec(cr["spec"])
    # Every key Secret a tenant references is in the same file, with that key.
    hashes = {
        t.name: hash_key(_secret_value(SAMPLES_DOCS[filename], t.key_secret_ref.name, t.key_secret_ref.key), SALT)
        for t in spec.keyed_tenants
        if t.key_secret_ref is not None
    }
    owner = Owner(cr["metadata"]["name"], cr["metadata"]["namespace"], "uid-sample")
    # with the gateway and no quota key the operator keeps a random edge token; any will do here
    rendered = render(owner, spec, hashes, ENV, salt=SALT, edge_token="sample-edge-token-" + "0" * 46)
    for manifest in rendered.manifests:
        if manifest["apiVersion"] in ("keda.sh/v1alpha1", "monitoring.coreos.com/v1"):
            continue  # not in kubernetes-validate; the operator tests check their shape
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    if spec.autoscaling.engine == "keda":
        assert any(m["kind"] == "ScaledObject" for m in rendered.manifests)


def test_samples_cover_the_promised_cases() -> None:
    specs = {f: parse_spec(cr["spec"]) for f, cr in _services()}
    assert any(s.resources.gpus == 0 and s.model.format == "demo" for s in specs.values()), "CPU demo"
    assert any(s.resources.gpus >= 1 and s.concurrency.permits == "auto" for s in specs.values()), "GPU auto"
    assert any(s.keyed_tenants and len(s.priorities.classes) > 1 for s in specs.values()), "tenants"
    assert any(s.batching.max_batch_size != 1 for s in specs.values()), "batching"
    assert any(s.degradation.enabled and s.model.fallback for s in specs.values()), "degradation"
    keda = [s for s in specs.values() if s.autoscaling.engine == "keda"]
    assert keda, "KEDA autoscaling"
    # A KEDA sample without its own address relies on the chart's operator.prometheusUrl.
    assert any(s.autoscaling.prometheus_address is None for s in keda)


def test_cpu_samples_request_no_gpu() -> None:
    """The demo and synthetic models run on CPU: asking for a GPU would leave them Pending."""
    for filename, cr in _services():
        spec = parse_spec(cr["spec"])
        if spec.model.format in ("demo", "synthetic"):
            assert spec.resources.gpus == 0, filename


def _quick_start() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start on a cluster", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```[a-z]*\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "one command block in the quick start"
    return blocks[0].replace("\\\n", " ").strip().splitlines()


def test_readme_quick_start_uses_the_samples() -> None:
    """The quick start's YAML is a file in samples/ (no inline copy), it creates the namespace the
    sample uses, sets the chart's Prometheus URL with a key that exists, and queries that object."""
    commands = [shlex.split(line) for line in _quick_start()]
    assert not any("<<" in " ".join(c) for c in commands), "no inline YAML in the quick start"
    helm = next(c for c in commands if c[:2] == ["helm", "install"])
    assert helm[3] == "charts/sluiceway"
    sets = [helm[i + 1] for i, a in enumerate(helm) if a == "--set"]
    assert any(s.startswith("operator.prometheusUrl=http") for s in sets)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for s in sets:
        node: Any = values
        for part in s.split("=", 1)[0].split("."):
            assert part in node, f"--set {s}: no such chart value"
            node = node[part]
    applied = [c[3] for c in commands if c[:3] == ["kubectl", "apply", "-f"]]
    assert applied, "the quick start applies a sample"
    created = {c[3] for c in commands if c[:3] == ["kubectl", "create", "namespace"]}
    for path in applied:
        assert path.startswith("samples/") and (ROOT / path).is_file(), path
        for doc in yaml.safe_load_all((ROOT / path).read_text()):
            assert doc["metadata"]["namespace"] in created
            cr = doc
    get = next(c for c in commands if c[:2] == ["kubectl", "-n"] and "get" in c)
    assert get[2] == cr["metadata"]["namespace"] and get[-1] == cr["metadata"]["name"]
    parse_spec(cr["spec"])


def test_notes_point_at_existing_samples() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    named = re.findall(r"samples/[\w.-]+\.yaml", notes)
    assert named
    for path in named:
        assert (ROOT / path).is_file(), path
