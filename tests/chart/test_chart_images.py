"""The Dockerfiles cannot be built here (no container engine): parse them and check that what they
install, run and expose matches pyproject.toml, what the operator renders for inference pods and
what the chart renders for the controller."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from chart_support import CHART, IMAGES, ROOT, SAMPLES
from sluiceway_operator.render import Environment, Owner, render
from sluiceway_operator.spec import parse_spec


@dataclass
class Dockerfile:
    base: str = ""
    args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[str, str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    user: str = ""
    expose: set[int] = field(default_factory=set)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    workdir: str = ""


def parse_dockerfile(text: str) -> Dockerfile:
    """A small parser for the instructions these images use (continuations joined, comments
    dropped); ENTRYPOINT/CMD must be exec form (JSON), so signals reach the Python process."""
    logical: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    df = Dockerfile()
    for line in logical:
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        rest = rest.strip()
        if instr == "ARG":
            k, _, v = rest.partition("=")
            df.args[k] = v
        elif instr == "FROM":
            df.base = re.sub(r"\$\{(\w+)\}", lambda m: df.args[m.group(1)], rest)
        elif instr == "ENV":
            for k, v in re.findall(r"(\w+)=(\S+)", rest):
                df.env[k] = v
        elif instr == "COPY":
            *sources, dst = rest.split()
            df.copies += [(src, dst) for src in sources]
        elif instr == "RUN":
            df.runs.append(rest)
        elif instr == "USER":
            df.user = rest
        elif instr == "EXPOSE":
            df.expose |= {int(p) for p in rest.split()}
        elif instr in ("ENTRYPOINT", "CMD"):
            value = json.loads(rest)
            assert isinstance(value, list), f"{instr} must be exec form (a JSON list): {rest}"
            if instr == "ENTRYPOINT":
                df.entrypoint = value
            else:
                df.cmd = value
        elif instr == "WORKDIR":
            df.workdir = rest
        else:
            raise AssertionError(f"unexpected instruction {instr}")
    return df


POD = parse_dockerfile((IMAGES / "pod.Dockerfile").read_text())
CONTROLLER = parse_dockerfile((IMAGES / "controller.Dockerfile").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _installed_extra(df: Dockerfile) -> str:
    installs = [r for r in df.runs if "pip install" in r]
    assert len(installs) == 1, installs
    m = re.search(r'pip install "\.\[([\w,]+)\]"', installs[0])
    assert m, installs[0]
    return m.group(1)


def _rendered_pod_deployment() -> dict[str, Any]:
    cr = yaml.safe_load((SAMPLES / "demo-cpu.yaml").read_text())
    spec = parse_spec(cr["spec"])
    rendered = render(Owner("demo", "demo", "uid-1"), spec, {}, Environment())
    deployment: dict[str, Any] = next(m for m in rendered.manifests if m["kind"] == "Deployment")
    return deployment


@pytest.mark.parametrize("df", [POD, CONTROLLER], ids=["pod", "controller"])
def test_image_copies_what_pyproject_needs(df: Dockerfile) -> None:
    """The build context paths exist and include every package directory setuptools expects."""
    sources = {src.rstrip("/") for src, _ in df.copies}
    for src in sources:
        assert (ROOT / src).exists(), src
    for pkg_dir in PYPROJECT["tool"]["setuptools"]["package-dir"].values():
        assert any(pkg_dir == s or pkg_dir.startswith(s + "/") for s in sources), pkg_dir
    assert PYPROJECT["project"]["readme"] in sources
    assert df.user == "65532:65532"
    assert df.env["HOME"] == "/tmp"  # the root file system is read-only; /tmp is an emptyDir
    assert df.env["PIP_NO_CACHE_DIR"] == "1"


@pytest.mark.parametrize("name", ["pod", "controller"])
def test_build_context_keeps_what_the_dockerfile_copies(name: str) -> None:
    """BuildKit's <Dockerfile>.dockerignore: everything excluded except the paths COPY names."""
    df = POD if name == "pod" else CONTROLLER
    lines = [
        ln.strip()
        for ln in (IMAGES / f"{name}.Dockerfile.dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*"
    kept = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert kept == {src.rstrip("/") for src, _ in df.copies}


def test_pod_image_matches_what_the_operator_renders() -> None:
    assert _installed_extra(POD) == "pod"
    assert "pod" in PYPROJECT["project"]["optional-dependencies"]
    assert "torch" in POD.base and "cuda" in POD.base  # CUDA build of torch
    deployment = _rendered_pod_deployment()
    pod_spec = deployment["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    # The operator's command runs the image's entrypoint script with the image's default config path.
    assert container["command"][0] == POD.entrypoint[0] == "sluiceway-pod"
    assert POD.entrypoint[0] in PYPROJECT["project"]["scripts"]
    assert container["command"][1:] == POD.cmd
    # Ports: every container port the operator renders is exposed (http 8080, metrics 9091 once rendered).
    rendered_ports = {p["containerPort"] for p in container["ports"]}
    assert rendered_ports <= POD.expose
    assert {8080, 9091} <= POD.expose
    # The user the operator runs the pod as is the image's user.
    uid = pod_spec["securityContext"]["runAsUser"]
    assert POD.user == f"{uid}:{pod_spec['securityContext']['runAsGroup']}"
    # Mount points the operator uses exist in the image (created by a RUN mkdir).
    mkdirs = " ".join(r for r in POD.runs if r.startswith("mkdir"))
    for mount in container["volumeMounts"]:
        if mount["mountPath"] != "/tmp":
            assert mount["mountPath"] in mkdirs.split(), mount
    assert POD.env["WEB_CONCURRENCY"] == "1"


def test_controller_image_matches_the_chart() -> None:
    # the operator renders each service's gateway with this image by default (operator.gatewayImage)
    assert _installed_extra(CONTROLLER) == "operator,gateway"
    assert CONTROLLER.base.startswith("python:3.11-slim")
    scripts = PYPROJECT["project"]["scripts"]
    for script in ("sluiceway-operator", "sluiceway-scaler", "sluiceway", "sluiceway-gateway"):
        assert script in scripts
        module = scripts[script].split(":")[0]
        assert not module.startswith("sluiceway_pod"), f"{script} needs the pod extra ({module})"
    assert CONTROLLER.entrypoint == ["sluiceway-operator"] and CONTROLLER.cmd == ["run"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == "ghcr.io/sluiceway/sluiceway"
    assert values["podSecurityContext"]["runAsUser"] == 65532
    assert (
        CONTROLLER.user == f"{values['podSecurityContext']['runAsUser']}:{values['podSecurityContext']['runAsGroup']}"
    )
    deployment = (CHART / "templates" / "operator-deployment.yaml").read_text()
    scaler = (CHART / "templates" / "scaler.yaml").read_text()
    assert "command: [sluiceway-operator, run]" in deployment
    assert "command: [sluiceway-scaler]" in scaler
    assert "SLUICEWAY_GATEWAY_IMAGE" in deployment and '.Values.operator.gatewayImage' in deployment
    assert {8081, values["scaler"]["port"], values["scaler"]["metricsPort"]} <= CONTROLLER.expose


def test_samples_use_the_pod_image_repository() -> None:
    """The sandbox maps image repositories to entrypoints: samples name the pod image."""
    for path in sorted(SAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "InferenceService":
                assert doc["spec"]["model"]["image"].split(":")[0] == "ghcr.io/sluiceway/sluiceway-pod", path
