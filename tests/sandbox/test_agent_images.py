"""Image -> entrypoint: only known images run; anything else fails with a reason naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from sluiceway_sandbox.agent.images import ImageError, Images, repository


def test_repository_strips_tag_and_digest() -> None:
    assert repository("ghcr.io/sluiceway/sluiceway-pod:0.1.0") == "ghcr.io/sluiceway/sluiceway-pod"
    assert repository("ghcr.io/sluiceway/sluiceway@sha256:abc") == "ghcr.io/sluiceway/sluiceway"
    assert repository("localhost:5000/x/y:1") == "localhost:5000/x/y"


def test_unknown_image_fails_with_err_image_never_pull() -> None:
    with pytest.raises(ImageError) as err:
        Images().argv("nginx:1.25", [], [])
    assert err.value.reason == "ErrImageNeverPull"
    assert "nginx:1.25" in err.value.message and "ghcr.io/sluiceway/sluiceway-pod" in err.value.message


def test_known_image_maps_to_this_environments_console_script(tmp_path: Path) -> None:
    (tmp_path / "sluiceway-scaler").write_text("#!/bin/sh\n")
    argv = Images(bin_dir=tmp_path).argv("ghcr.io/sluiceway/sluiceway:0.1.0", ["sluiceway-scaler"], ["serve"])
    assert argv == [str(tmp_path / "sluiceway-scaler"), "serve"]


def test_known_image_refuses_a_command_it_does_not_provide(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="provides sluiceway-pod"):
        Images(bin_dir=tmp_path).argv("ghcr.io/sluiceway/sluiceway-pod", ["/bin/sh", "-c", "x"], [])
    with pytest.raises(ImageError, match="no default entrypoint"):
        Images(bin_dir=tmp_path).argv("ghcr.io/sluiceway/sluiceway-pod", [], ["serve"])


def test_binary_images_ignore_command_and_pass_args(tmp_path: Path) -> None:
    images = Images(bin_dir=tmp_path, binaries={"ghcr.io/kedacore/keda": tmp_path / "keda-operator"})
    argv = images.argv("ghcr.io/kedacore/keda:2.21.0", ["/keda"], ["--leader-elect=false"])
    assert argv == [str(tmp_path / "keda-operator"), "--leader-elect=false"]


def test_the_operator_rendered_gateway_runs_in_the_sandbox(tmp_path: Path) -> None:
    """Issue 19 §4: the gateway Deployment the operator renders (its default ``gateway_image``, the
    command ``sluiceway-gateway serve ...``) maps to this environment's ``sluiceway-gateway``."""
    from sluiceway_operator.render import Environment, Owner, build_gateway_children, build_pod_config
    from sluiceway_operator.spec import parse_spec

    spec = parse_spec(
        {
            "model": {"image": "ghcr.io/sluiceway/sluiceway-pod:0.1.0", "format": "synthetic", "source": "synthetic:5"},
            "autoscaling": {"engine": "none"},
            "gateway": {"enabled": True},
        }
    )
    owner = Owner(name="edge", namespace="serving", uid="u1")
    env = Environment()
    children = build_gateway_children(owner, spec, build_pod_config(owner, spec, env), "", env)
    dep = next(c for c in children if c["kind"] == "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    (tmp_path / "sluiceway-gateway").write_text("#!/bin/sh\n")
    argv = Images(bin_dir=tmp_path).argv(c["image"], c["command"], c.get("args", []))
    assert argv == [str(tmp_path / "sluiceway-gateway"), *c["command"][1:]]


def test_the_chart_the_sandbox_installs_names_a_gateway_image_the_agent_runs(tmp_path: Path) -> None:
    """``helm template`` of ``charts/sluiceway`` with the sandbox's own values (with and without
    KEDA): the operator's ``SLUICEWAY_GATEWAY_IMAGE`` is an image the agent maps to
    ``sluiceway-gateway``."""
    import subprocess

    import yaml
    from sluiceway_sandbox import helm
    from sluiceway_sandbox.layout import layout_for
    from sluiceway_sandbox.lifecycle import CHART, ROOT, chart_values

    try:
        helm_bin = helm.helm_binary(ROOT, build=False)
    except FileNotFoundError as err:
        pytest.skip(str(err))
    (tmp_path / "sluiceway-gateway").write_text("#!/bin/sh\n")
    layout = layout_for(tmp_path / "sb")
    for keda in (True, False):
        values = chart_values(layout.prometheus_url, keda)
        argv = [str(helm_bin), "template", helm.RELEASE, str(CHART), "--namespace", helm.NAMESPACE]
        argv += ["--kube-version", "1.34.4"]  # the sandbox's control plane (helm's offline default is older)
        for k, v in values.items():
            argv += ["--set", f"{k}={v}"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, env={"HOME": str(tmp_path)}, timeout=60)
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sluiceway-operator")
        containers = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for c in containers for e in c.get("env", [])}
        image = env["SLUICEWAY_GATEWAY_IMAGE"]
        argv_gw = Images(bin_dir=tmp_path).argv(image, ["sluiceway-gateway", "serve"], [])
        assert argv_gw == [str(tmp_path / "sluiceway-gateway"), "serve"], image
