"""The chart's ``prometheusAuth`` (issue 23 §1), through the real helm: one credentials file (the
format of ``sluiceway_core.promauth``) in the ConfigMap ``sluiceway-prometheus-auth``, passed to
the scaler (``--prometheus-auth-file``) and the operator (``SLUICEWAY_PROMETHEUS_AUTH_FILE``), and
every Secret it names mounted in both pods at the path the file names.

The strongest check: each rendered pod's mounts are materialised in a temporary root (the ConfigMap's
``auth.json`` and each Secret's keys written where the kubelet would put them), and the scaler's
own loader, :func:`sluiceway_core.promauth.load_prom_auth`, reads the file through those paths.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from chart_support import CHART, ROOT, find, helm_binary, run_helm, template, write_values
from sluiceway_core.promauth import load_prom_auth

sys.path.insert(0, str(ROOT / "tests" / "scaler"))
from tlscerts import CA  # the scaler tests' real X.509 material

_CA = CA()
_CLIENT = _CA.issue("sluiceway", server=False)

AUTH: list[dict[str, Any]] = [
    {
        "url": "https://mimir.example/prometheus",
        "bearerToken": {"secretName": "mimir-reader"},
        "headers": {"X-Scope-OrgID": "team-a"},
    },
    {
        "url": "https://prometheus.monitoring.svc:9090",
        "basicAuth": {"secretName": "prometheus-basic", "username": "sluiceway"},
        "tls": {"secretName": "prometheus-client", "caKey": "ca.crt", "certKey": "tls.crt", "keyKey": "tls.key"},
    },
    {
        "url": "http://thanos.monitoring.svc:10902",
        "basicAuth": {"secretName": "prometheus-basic", "usernameKey": "user", "passwordKey": "pass"},
    },
]
#: What each Secret holds (as the user would create them).
SECRETS = {
    "mimir-reader": {"token": "tok"},
    "prometheus-basic": {"password": "pw", "user": "thanos-reader", "pass": "pw2"},
    "prometheus-client": {
        "ca.crt": _CA.cert.decode(),
        "tls.crt": _CLIENT.cert.decode(),
        "tls.key": _CLIENT.key.decode(),
    },
}
VALUES = {
    "operator": {"prometheusUrl": "https://prometheus.monitoring.svc:9090"},
    "scaler": {"tls": {"enabled": False}},
    "prometheusAuth": AUTH,
}


@pytest.fixture(scope="module")
def helm() -> str:
    path, why = helm_binary()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-promauth")


@pytest.fixture(scope="module")
def docs(helm: str, home: Path) -> list[dict[str, Any]]:
    return template(helm, home, VALUES)


def _container(docs: list[dict[str, Any]], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = find(docs, "Deployment", name)["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


def _materialise(root: Path, docs: list[dict[str, Any]], deployment: str) -> None:
    """Write what the kubelet would mount into ``deployment``'s container, under ``root``."""
    spec, container = _container(docs, deployment)
    volumes = {v["name"]: v for v in spec["volumes"]}
    config = find(docs, "ConfigMap", "sluiceway-prometheus-auth")["data"]
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        target = root / mount["mountPath"].lstrip("/")
        if "configMap" in volume:
            assert volume["configMap"]["name"] == "sluiceway-prometheus-auth"
            content = dict(config)
        elif "secret" in volume and volume["secret"]["secretName"] in SECRETS:
            content = SECRETS[volume["secret"]["secretName"]]
        else:
            continue
        assert mount.get("readOnly") is True, mount
        target.mkdir(parents=True, exist_ok=True)
        for key, value in content.items():
            (target / key).write_text(value)
    auth = root / "etc/sluiceway/prometheus-auth/config/auth.json"
    text = auth.read_text().replace('"/etc/', f'"{root}/etc/')  # the same paths, under the temp root
    auth.write_text(text)


@pytest.mark.parametrize("deployment", ["sluiceway-scaler", "sluiceway-operator"])
def test_each_pod_can_load_the_credentials_file_through_its_mounts(
    docs: list[dict[str, Any]], deployment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _materialise(tmp_path, docs, deployment)
    _, container = _container(docs, deployment)
    if deployment == "sluiceway-scaler":
        args = [str(a) for a in container["args"]]
        path = args[args.index("--prometheus-auth-file") + 1]
    else:
        path = {e["name"]: e.get("value") for e in container["env"]}["SLUICEWAY_PROMETHEUS_AUTH_FILE"]
    monkeypatch.chdir(tmp_path)
    auth = load_prom_auth(tmp_path / path.lstrip("/"))
    mimir = auth.for_url("https://mimir.example:443/prometheus/")
    assert mimir is not None
    headers, context = mimir.request()
    assert headers == {"X-Scope-OrgID": "team-a", "Authorization": "Bearer tok"} and context is None
    thanos = auth.for_url("http://thanos.monitoring.svc:10902")
    assert thanos is not None
    assert thanos.request()[0]["Authorization"] == "Basic dGhhbm9zLXJlYWRlcjpwdzI="  # thanos-reader:pw2
    prom = auth.for_url("https://prometheus.monitoring.svc:9090")
    assert prom is not None and prom.ca_file is not None and prom.cert_file is not None
    assert prom.username == "sluiceway" and prom.password_file is not None
    assert prom.password_file.read_text() == "pw"


def test_secrets_are_mounted_once_each_and_a_change_rolls_the_pods(
    helm: str, home: Path, docs: list[dict[str, Any]]
) -> None:
    for deployment in ("sluiceway-scaler", "sluiceway-operator"):
        spec, _ = _container(docs, deployment)
        names = [v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v]
        assert sorted(n for n in names if n in SECRETS) == sorted(SECRETS), names
    before = find(docs, "Deployment", "sluiceway-scaler")["spec"]["template"]["metadata"]["annotations"]
    changed = {**VALUES, "prometheusAuth": [{**AUTH[0], "headers": {"X-Scope-OrgID": "team-b"}}]}
    after = find(template(helm, home, changed), "Deployment", "sluiceway-scaler")["spec"]["template"]["metadata"]
    assert before["sluiceway.io/prometheus-auth"] != after["annotations"]["sluiceway.io/prometheus-auth"]


def test_without_credentials_nothing_is_rendered(helm: str, home: Path) -> None:
    docs = template(helm, home, None)
    assert not [d for d in docs if d["metadata"]["name"] == "sluiceway-prometheus-auth"]
    for deployment in ("sluiceway-scaler", "sluiceway-operator"):
        _, container = _container(docs, deployment)
        assert "--prometheus-auth-file" not in container.get("args", [])
        assert "SLUICEWAY_PROMETHEUS_AUTH_FILE" not in {e["name"] for e in container["env"]}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"url": "https://p", "bearerToken": {"secret": "x"}}, "additional properties 'secret' not allowed"),
        (
            {"url": "https://p", "bearerToken": {"secretName": "a"}, "basicAuth": {"secretName": "b", "username": "u"}},
            "prometheusAuth/0",
        ),
        ({"url": "https://p", "headers": {"Bad Name": "x"}}, "invalid propertyName 'Bad Name'"),
        ({"url": "https://user:pw@p"}, "prometheusAuth/0/url"),
        ({"url": "https://p", "basicAuth": {"secretName": "b"}}, "set username, or usernameKey"),
    ],
)
def test_bad_entries_fail_before_anything_is_applied(
    helm: str, home: Path, entry: dict[str, Any], message: str
) -> None:
    path = write_values(home / "bad-auth.yaml", {"prometheusAuth": [entry]})
    out = run_helm(helm, home, "template", "sw", str(CHART), "-f", str(path))
    assert out.returncode != 0 and message in out.stderr, out.stderr
