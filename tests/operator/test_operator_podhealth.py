"""PodsHealthy, pure (issue 20: "a pod that fails to start (crash loop): ... the condition says
why"): the pod statuses below are shaped as the kubelet and the scheduler write them."""

from __future__ import annotations

import datetime
from typing import Any

from sluiceway_operator.status import (
    CRASH_RESTARTS,
    POD_MESSAGE_MAX,
    UNSCHEDULABLE_SECONDS,
    Observed,
    build_pod_problems,
    build_pods_healthy,
    compute_status,
    scrub_message,
)

NOW = datetime.datetime(2026, 12, 3, 12, 0, 0, tzinfo=datetime.UTC)


def _ago(seconds: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(
    name: str, *statuses: dict[str, Any], conditions: list[dict[str, Any]] | None = None, **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {"containerStatuses": list(statuses), "conditions": conditions or [], **status},
    }


def _crash_looping(restarts: int = 4, message: str = "", reason: str = "Error", code: int = 1) -> dict[str, Any]:
    return {
        "name": "sluiceway-pod",
        "ready": False,
        "restartCount": restarts,
        "state": {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": "back-off 40s restarting failed container=sluiceway-pod pod=s-1_ns(0f0f)",
            }
        },
        "lastState": {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "message": message,
                "startedAt": _ago(50),
                "finishedAt": _ago(45),
            }
        },
    }


def _running(ready: bool = True, restarts: int = 0, last_exit: int | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": "sluiceway-pod",
        "ready": ready,
        "restartCount": restarts,
        "state": {"running": {"startedAt": _ago(5)}},
        "lastState": {},
    }
    if last_exit is not None:
        c["lastState"] = {"terminated": {"exitCode": last_exit, "reason": "Error", "finishedAt": _ago(6)}}
    return c


TRACEBACK = (
    "INFO loading model synthetic:10\n"
    "Traceback (most recent call last):\n"
    '  File "/app/serve.py", line 3, in <module>\n'
    "RuntimeError: CUDA error: out of memory (tried to allocate 2.00 GiB)\n\n"
)


def test_a_crash_loop_names_the_pod_the_exit_and_the_last_line_of_the_termination_message() -> None:
    pods = [_pod("s-1", _crash_looping(message=TRACEBACK))]
    cond = build_pods_healthy(pods, NOW)
    assert (cond.type, cond.status, cond.reason) == ("PodsHealthy", "False", "CrashLoopBackOff")
    assert cond.message == (
        "pod s-1 container sluiceway-pod: CrashLoopBackOff, 4 restarts, last exit 1 (Error): "
        "RuntimeError: CUDA error: out of memory (tried to allocate 2.00 GiB)"
    )


def test_oom_killed_without_a_message_still_says_why() -> None:
    cond = build_pods_healthy([_pod("s-1", _crash_looping(reason="OOMKilled", code=137))], NOW)
    assert cond.reason == "CrashLoopBackOff"
    assert cond.message.endswith("CrashLoopBackOff, 4 restarts, last exit 137 (OOMKilled)")


def test_between_back_offs_a_container_that_keeps_failing_is_still_crash_looping() -> None:
    # the kubelet restarted it: running again, not ready, lastState non-zero
    assert build_pods_healthy(
        [_pod("s-1", _running(ready=False, restarts=CRASH_RESTARTS, last_exit=2))], NOW
    ).status == ("False")
    # one restart is not a loop; a container that came back ready has recovered
    assert build_pods_healthy([_pod("s-1", _running(ready=False, restarts=1, last_exit=2))], NOW).status == "True"
    assert build_pods_healthy([_pod("s-1", _running(ready=True, restarts=5, last_exit=2))], NOW).status == "True"
    # a clean exit (0) is not a failure
    assert build_pods_healthy([_pod("s-1", _running(ready=False, restarts=3, last_exit=0))], NOW).status == "True"


def test_image_and_config_errors_carry_the_kubelets_reason() -> None:
    waiting = {
        "name": "sluiceway-pod",
        "ready": False,
        "restartCount": 0,
        "state": {
            "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.example/p:9"'}
        },
    }
    cond = build_pods_healthy([_pod("s-2", waiting)], NOW)
    assert (cond.status, cond.reason) == ("False", "ImagePullBackOff")
    assert (
        cond.message
        == 'pod s-2 container sluiceway-pod: ImagePullBackOff: Back-off pulling image "registry.example/p:9"'
    )
    starting = {**waiting, "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert build_pods_healthy([_pod("s-2", starting)], NOW).status == "True"


def test_unschedulable_counts_only_after_the_grace() -> None:
    def pending(seconds: float) -> dict[str, Any]:
        msg = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."
        cond = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": msg,
            "lastTransitionTime": _ago(seconds),
        }
        return _pod("s-3", conditions=[cond], phase="Pending")

    assert build_pods_healthy([pending(UNSCHEDULABLE_SECONDS - 1)], NOW).status == "True"
    cond = build_pods_healthy([pending(95)], NOW)
    assert (cond.status, cond.reason) == ("False", "Unschedulable")
    assert cond.message.startswith("pod s-3 cannot be scheduled for 95s: 0/3 nodes are available: 3 Insufficient")


def test_crash_loops_come_first_and_the_count_is_given() -> None:
    unsched = _pod(
        "a-0",
        conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": _ago(600)}
        ],
    )
    pods = [unsched, _pod("b-1", _crash_looping()), _pod("c-2", _running()), _pod("d-3", _crash_looping())]
    assert [p.reason for p in build_pod_problems(pods, NOW)] == [
        "CrashLoopBackOff",
        "CrashLoopBackOff",
        "Unschedulable",
    ]
    cond = build_pods_healthy(pods, NOW)
    assert cond.message.startswith("pod b-1 container sluiceway-pod: CrashLoopBackOff")
    assert cond.message.endswith("(3 of 4 pods cannot start)")


def test_the_storage_initializer_and_pods_being_deleted_are_left_out() -> None:
    init_failing = {
        "name": "storage-initializer",
        "ready": False,
        "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 11, "reason": "Error", "message": "fetch: failed (no-such-key)"}},
    }
    serving = {
        "name": "sluiceway-pod",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": "PodInitializing"}},
    }
    fetching = _pod("f-1", serving, initContainerStatuses=[init_failing])
    deleting = _pod("g-1", _crash_looping())
    deleting["metadata"]["deletionTimestamp"] = _ago(1)
    cond = build_pods_healthy([fetching, deleting], NOW)
    assert (cond.status, cond.reason) == ("True", "NoFailingPods")  # ModelFetched reports the first
    assert cond.message == "no pod is crash-looping or unschedulable (1 pods)"


def test_scrub_message_removes_credentials_and_bounds_the_length() -> None:
    text = (
        "connecting\nerror: GET https://user:pa55@store.example/m.pt?X-Amz-Signature=abc123: 403; "
        "token=eyJhbGciOi password: hunter2 Authorization: Bearer sk-live-123\x07\n"
    )
    out = scrub_message(text)
    for secret in ("pa55", "user:", "abc123", "eyJhbGciOi", "hunter2", "sk-live-123", "\x07"):
        assert secret not in out, (secret, out)
    assert out.startswith("error: GET https://store.example/m.pt: 403; token=<redacted>")
    long = scrub_message("x" * 5000)
    assert len(long) == POD_MESSAGE_MAX and long.endswith("\u2026")
    assert scrub_message("") == "" and scrub_message("\n \n") == ""


def _observed(pods: list[dict[str, Any]], read: bool = True) -> Observed:
    dep = {
        "spec": {"replicas": 1},
        "status": {
            "replicas": 1,
            "readyReplicas": 0,
            "conditions": [
                {
                    "type": "Available",
                    "status": "False",
                    "reason": "MinimumReplicasUnavailable",
                    "message": "Deployment does not have minimum availability.",
                }
            ],
        },
    }
    return Observed(
        generation=2,
        endpoint="http://s.ns.svc:8080",
        engine="none",
        spec_replicas=1,
        spec_permits="auto",
        config_hash="abc",
        deployment=dep,
        pods=pods,
        pods_read_at=NOW if read else None,
    )


def test_ready_carries_the_crash_loop_instead_of_the_deployments_minimum_availability() -> None:
    status = compute_status(_observed([_pod("s-1", _crash_looping(message=TRACEBACK))]), None, "T0")
    conds = {c["type"]: c for c in status["conditions"]}
    assert [c["type"] for c in status["conditions"]] == [
        "Ready",
        "ConfigValid",
        "PodsHealthy",
        "Available",
        "AutoscalingReady",
        "MetricsAvailable",
    ]
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "CrashLoopBackOff")
    assert conds["Ready"]["message"].startswith("PodsHealthy: pod s-1 container sluiceway-pod: CrashLoopBackOff")
    assert conds["PodsHealthy"]["observedGeneration"] == 2
    assert "phase" not in status
    # healthy pods: Ready falls through to the Deployment's own reason, as before
    status = compute_status(_observed([_pod("s-1", _running(ready=False))]), None, "T0")
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["PodsHealthy"]["status"] == "True"
    assert conds["Ready"]["reason"] == "MinimumReplicasUnavailable"
    # pods not read: no PodsHealthy condition at all
    status = compute_status(_observed([], read=False), None, "T0")
    assert "PodsHealthy" not in {c["type"] for c in status["conditions"]}
