"""Bad input: hypothesis-generated InferenceService specs against the real API server.

Each generated spec is either refused by the API server with a schema/CEL message (422), or
accepted; an accepted one is either refused by the operator's model (``SpecError`` -> the
operator reports ``ConfigValid=False``) or rendered, and then every rendered child passes a
server-side dry-run apply (the API server's own validation and admission). ``render()`` raises
nothing but ``SpecError``. Bounded: a fixed number of examples, no deadline (the box is loaded).
"""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kubetools import KEDA_STANDIN_CRD, Admin, ControlPlane, establish_crd
from operator_support import load_crd
from sluiceway_operator.kube import ApiError, Kube, is_refusal
from sluiceway_operator.render import Environment, Owner, render
from sluiceway_operator.spec import SpecError, parse_spec

pytestmark = [pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(900)]

NS = "sluiceway-fuzz"
EXAMPLES = 100
# No operator-wide Prometheus: engine prometheus without prometheusAddress is a SpecError.
ENV = Environment(keda=True, service_monitor=False, prometheus_url=None)

_text = st.text(alphabet=string.ascii_letters + string.digits + "-_./: ", max_size=20)
_good_name = st.from_regex(r"\A[a-z][a-z0-9-]{0,10}[a-z0-9]\Z")
_name = st.one_of(_good_name, _good_name, _good_name, _text)
_quantity = st.one_of(
    st.integers(-5, 10**6),
    st.sampled_from(["1", "500m", "4Gi", "0", "1.5", "1e3", "1Ki", "+2"] * 2 + ["-1Gi", "abc", "", " 1"]),
)
_duration = st.one_of(
    st.sampled_from(["0s", "1ms", "5s", "500ms", "1m30s", "2h", "61m", "1.5s", "", "5"]),
    st.from_regex(r"\A[0-9]{1,2}(s|m)\Z"),
    st.from_regex(r"\A[0-9]{1,2}(s|m)\Z"),
)
_label_key = st.one_of(
    st.sampled_from(
        ["gpu", "nvidia.com/gpu.product", "example.com/ok", "zone"] * 3 + ["a/b/c", "Bad Key", "-x", "k" * 64]
    ),
    _text,
)
_toleration = st.fixed_dictionaries(
    {},
    optional={
        "key": _label_key,
        "operator": st.sampled_from(["Exists", "Equal", "Bogus"]),
        "value": st.one_of(st.sampled_from(["", "true", "a100"]), _text, st.just("v" * 64)),
        "effect": st.sampled_from(["", "NoSchedule", "PreferNoSchedule", "NoExecute", "Sometimes"]),
        "tolerationSeconds": st.integers(-10, 10**6),
    },
)
_affinity = st.sampled_from(
    [
        {},
        {"nodeAffinity": {}},
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In"}]}]
                }
            }
        },
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a"]}]}]
                }
            }
        },
        {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0}]}},
        {"surprise": True},
    ]
)
_GOOD = 6  # valid choices are repeated so that most examples get past the schema
_format_source = st.sampled_from(
    [("synthetic", "synthetic:5"), ("demo", "demo"), ("python", "pkg.mod:make"), ("torchscript", "/m/model.pt")] * _GOOD
    + [("synthetic", "synthetic:9999999"), ("python", "x"), ("torchscript", "model.pt"), ("demo", "synthetic:1")]
)
_model = st.tuples(
    st.sampled_from(["registry.example/pod:1"] * 4 * _GOOD + ["   ", "img with space", ""]),
    _format_source,
    st.fixed_dictionaries(
        {},
        optional={
            "name": _name,
            "persistentVolumeClaim": st.fixed_dictionaries(
                {"claimName": _name},
                optional={
                    "mountPath": st.sampled_from(
                        ["/models", "/data/w"] * _GOOD + ["/tmp", "/", "/etc", "/a/../b", "/d/"]
                    )
                },
            ),
            "fallback": st.fixed_dictionaries(
                {"source": st.sampled_from(["synthetic:1", "demo", "a.b:c", "/f.pt"] * 2 + ["nonsense", "x:"])},
                optional={"permits": st.integers(0, 70)},
            ),
        },
    ),
).map(lambda t: {"image": t[0], "format": t[1][0], "source": t[1][1], **t[2]})
_spec = st.fixed_dictionaries(
    {"model": _model},
    optional={
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "gpus": st.integers(-1, 20),
                "cpu": _quantity,
                "memory": _quantity,
                "gpuResourceName": st.sampled_from(["nvidia.com/gpu", "gpu", "kubernetes.io/gpu", "amd.com/gpu"]),
            },
        ),
        "placement": st.fixed_dictionaries(
            {},
            optional={
                "nodeSelector": st.dictionaries(
                    _label_key, st.one_of(st.sampled_from(["true", "a100", ""]), _text, st.just("v" * 64)), max_size=3
                ),
                "tolerations": st.lists(_toleration, max_size=3),
                "affinity": _affinity,
                "priorityClassName": _name,
                "runtimeClassName": _name,
            },
        ),
        "serviceAccountName": _name,
        "degradation": st.fixed_dictionaries({"enabled": st.booleans()}),
        "imagePullSecrets": st.lists(_name, max_size=2),
        "replicas": st.integers(-1, 1001),
        "concurrency": st.fixed_dictionaries(
            {}, optional={"permits": st.one_of(st.integers(-1, 2000), st.sampled_from(["auto", "many"]))}
        ),
        "queue": st.fixed_dictionaries({}, optional={"maxDepth": st.one_of(st.integers(0, 10), st.just("auto"))}),
        "timeouts": st.one_of(
            st.sampled_from(
                [{"queue": "2s", "request": "10s"}, {"queue": "500ms", "request": "1m", "drain": "45s"}, {}]
            ),
            st.fixed_dictionaries({}, optional={"queue": _duration, "request": _duration, "drain": _duration}),
        ),
        "priorities": st.one_of(
            st.sampled_from([{"classes": ["high", "low"], "default": "low"}, {"aging": "2s"}, {}]),
            st.fixed_dictionaries(
                {},
                optional={
                    "classes": st.lists(
                        st.sampled_from(["critical", "standard", "batch", "a" * 33, "Bad"]), max_size=4
                    ),
                    "default": st.sampled_from(["standard", "critical", "none"]),
                },
            ),
        ),
        "autoscaling": st.fixed_dictionaries(
            {},
            optional={
                "engine": st.sampled_from(["keda", "prometheus", "builtin", "none"]),
                "minReplicas": st.one_of(st.integers(1, 3), st.integers(-1, 5)),
                "maxReplicas": st.one_of(st.integers(3, 6), st.integers(0, 6)),
            },
        ),
    },
)


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> Admin:
    a = Admin(Kube(control_plane.client()))
    establish_crd(a, load_crd())
    establish_crd(a, KEDA_STANDIN_CRD)
    if a.get(f"/api/v1/namespaces/{NS}") is None:
        a.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    return a


OUTCOMES: dict[str, int] = {
    "refused by the API server": 0,
    "ConfigValid=False": 0,
    "rendered and admitted": 0,
}


def test_generated_specs(admin: Admin) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(spec=_spec)
    # Explicit examples of the outcome the schema cannot see (the pod's own limits, the cluster).
    @example(spec={"model": {"image": "i:1", "format": "synthetic", "source": "synthetic:9999999"}})
    @example(
        spec={"model": {"image": "i:1", "format": "demo", "source": "demo"}, "autoscaling": {"engine": "prometheus"}}
    )
    def check(spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": "sluiceway.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "fuzz", "namespace": NS},
            "spec": spec,
        }
        try:
            stored = admin.create(f"/apis/sluiceway.io/v1alpha1/namespaces/{NS}/inferenceservices", body, dry_run=True)
        except ApiError as err:
            assert err.status == 422, err  # a schema or CEL message, never a 500
            assert "spec" in str(err) or "metadata" in str(err), err
            OUTCOMES["refused by the API server"] += 1
            return
        refused: list[str] = []
        try:
            parsed = parse_spec(stored["spec"])
            rendered = render(Owner("fuzz", NS, "0b7a1b0e-0000-4000-8000-000000000000"), parsed, {}, ENV, replicas=None)
        except SpecError as err:
            assert str(err), "a SpecError names its field"
            OUTCOMES["ConfigValid=False"] += 1
            return
        for manifest in rendered.manifests:
            try:
                admin.kube.apply(manifest, dry_run=True)
            except ApiError as err:
                refused.append(f"{manifest['kind']}: {err}")
        assert not refused, f"the operator rendered children the API server refuses: {refused}\nspec={spec}"
        OUTCOMES["rendered and admitted"] += 1

    check()
    print(f"\n{EXAMPLES} generated specs: {OUTCOMES}")
    # The generator reaches every outcome (a fuzz test that only ever hits one branch proves little).
    assert OUTCOMES["refused by the API server"] and OUTCOMES["rendered and admitted"], OUTCOMES
    assert OUTCOMES["ConfigValid=False"], OUTCOMES


def test_refusal_classification() -> None:
    assert is_refusal(ApiError("x: 422 Unprocessable Entity", 422))
    assert is_refusal(ApiError("x: 500: failed to create typed patch object", 500))
    assert not is_refusal(ApiError("x: 500 Internal Server Error: etcd timeout", 500))
    assert not is_refusal(ApiError("connection refused", None))
