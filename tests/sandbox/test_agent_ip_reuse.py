"""The sandbox agent's pod addresses (issue 20, the hand-off lag): a pod's address is not given to
the next pod at once. With the lowest free address, a pod that replaced one just gone (the scale to
zero and back of tests/sandbox/test_scale_to_zero.py) got its predecessor's address, and every
network namespace that had talked to the old pod (the gateway's) kept the old pod's MAC in its
neighbour cache: its connections to the new pod timed out until that entry expired, 15 to 45 s
(the kernel's randomised reachable time, then its probes). The gateway's log showed it: the new pod
``unreachable`` (connect timed out) for 40 s while its endpoint was ready. Addresses now go round
the range as the CNI's host-local IPAM does: the next free one after the last given."""

from __future__ import annotations

from pathlib import Path

from sluiceway_sandbox.agent.__main__ import Agent
from sluiceway_sandbox.layout import layout_for
from sluiceway_sandbox.netns import ip_for_index, next_free_index, pod_address_count


def test_next_free_index_goes_round_the_range() -> None:
    assert next_free_index(set(), -1, 10) == 0
    assert next_free_index({0, 1}, 1, 10) == 2
    assert next_free_index(set(), 3, 10) == 4  # 0..3 free again, still the next one after the last
    assert next_free_index({0, 9}, 8, 10) == 1  # wraps past the end, skipping what is used
    assert next_free_index(set(range(10)) - {5}, 5, 10) == 5  # the only free one, even the last given
    try:
        next_free_index(set(range(10)), 3, 10)
    except ValueError as err:
        assert "exhausted" in str(err)
    else:
        raise AssertionError("a full range must raise")


def test_a_pod_does_not_get_the_address_of_the_pod_just_gone(tmp_path: Path) -> None:
    layout = layout_for(tmp_path)
    agent = Agent(layout, cpu=2, gpus=0, binaries={}, version="test")
    first = agent.allocate_ip("uid-a")
    agent.release_ip("uid-a")  # scaled to zero
    second = agent.allocate_ip("uid-b")  # scaled back to one
    assert second != first, (first, second)
    assert agent.allocate_ip("uid-b") == second  # stable for its pod
    # a Pod keeps its reported address across an agent restart when it is free
    assert agent.allocate_ip("uid-c", preferred=first) == first
    assert pod_address_count(layout) == 65536 - 257 - 1
    assert ip_for_index(layout, pod_address_count(layout) - 1) == "198.18.255.254"
