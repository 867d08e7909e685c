"""Issue 15's attacks on the extender's memory and memos, as regression tests: a forged request
cannot change another pod's decision, unknown node names are not kept, and memos stay within
their byte bounds whatever clients send."""

import copy
import json
import tracemalloc

import pytest

from scheduler_extender.served import decider
from scheduler_extender.service import decisions as server  # the memo bounds
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.served.grouped import GroupedEngine
from scheduler_extender.served.memo import ENTRY_OVERHEAD_BYTES, BoundedMemo
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.cluster.sources import StaticSource
from scheduler_extender.service.wire import parse_extender_args
from tests.factories import EXAMPLES, pod

NODES = sorted(p.stem for p in (EXAMPLES / "cluster").glob("*.json"))


@pytest.fixture
def service():
    return ExtenderService(GroupedEngine(), StaticSource(EXAMPLES / "cluster", default_catalog()))


def filter_(service, p, names=NODES):
    return service.filter(parse_extender_args(json.dumps({"Pod": p, "NodeNames": names}).encode()))


def prioritize(service, p, names=NODES):
    return service.prioritize(parse_extender_args(json.dumps({"Pod": p, "NodeNames": names}).encode()))


def versioned(p, uid="victim-uid", version="41"):
    p = copy.deepcopy(p)
    p["metadata"].update(uid=uid, resourceVersion=version)
    return p


def test_a_request_forged_with_another_pods_uid_and_resource_version_does_not_change_its_decision(service):
    victim = versioned(pod({"gpuplace.io/vram": "20Gi"}, name="victim", namespace="team-a"))
    honest = ExtenderService(GroupedEngine(), StaticSource(EXAMPLES / "cluster", default_catalog()))
    expected_filter, expected_scores = filter_(honest, victim), prioritize(honest, victim)
    assert expected_filter["NodeNames"], "the victim fits some node"

    # The forgery: the victim's name, namespace, uid and resourceVersion, asking for what no node has.
    forged = versioned(pod({"gpuplace.io/vram": "900Gi"}, name="victim", namespace="team-a"))
    assert filter_(service, forged)["NodeNames"] == []
    prioritize(service, forged)

    assert filter_(service, victim) == expected_filter
    assert prioritize(service, victim) == expected_scores


def test_unknown_node_names_are_answered_but_not_kept(service):
    for batch in range(5):
        strangers = [f"no-such-node-{batch}-{i}" for i in range(2000)]
        got = filter_(service, pod({"gpuplace.io/vram": "20Gi"}), NODES + strangers)
        assert got["NodeNames"] and set(got["NodeNames"]) <= set(NODES)
        failed = {**got["FailedNodes"], **got["FailedAndUnresolvableNodes"]}
        assert set(strangers) <= set(failed)
    index = service._node_index
    assert set(index.states) <= set(NODES)
    assert all(set(keys) <= set(NODES) for keys in index.keys.values())


def test_a_list_mixing_known_and_unknown_names_gets_the_same_verdicts_as_each_node_alone(service):
    p = pod({"gpuplace.io/vram": "20Gi"})
    mixed = filter_(service, p, ["stranger-a", *NODES, "stranger-b"])
    for name in NODES:
        alone = filter_(ExtenderService(GroupedEngine(), StaticSource(EXAMPLES / "cluster", default_catalog())), p, [name])
        assert (name in mixed["NodeNames"]) == (name in alone["NodeNames"])


def test_distinct_giant_pod_specs_leave_memory_within_the_memo_bounds(service):
    # 60 distinct pods of 1 MiB each (an annotation outside gpuplace.io, which is left alone):
    # kept whole as memo keys this was 60 MiB; by digest, a few kilobytes each.
    filter_(service, pod({"gpuplace.io/vram": "20Gi"}))  # warm the node index first
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(60):
            p = pod({"gpuplace.io/vram": "20Gi", "example.com/blob": f"{i}:" + "x" * 2**20}, name=f"big-{i}")
            filter_(service, p)
            prioritize(service, p)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert service.decider._specs.size_bytes <= decider.MAX_JOB_BYTES
    assert grown < 24 * 2**20, f"memory grew by {grown / 2**20:.1f} MiB"


def test_a_memo_holds_no_more_entries_or_bytes_than_its_bounds():
    memo: BoundedMemo[str] = BoundedMemo(max_entries=3, max_bytes=10 * ENTRY_OVERHEAD_BYTES)
    for i in range(10):
        memo.put(i, str(i), 0)
    assert len(memo) == 3 and memo.get(9) == "9" and memo.get(6) is None
    memo.put("big", "x", 8 * ENTRY_OVERHEAD_BYTES)
    assert memo.size_bytes <= memo.max_bytes and memo.get("big") == "x"
    assert len(memo) == 2  # two of the small ones went to make room


def test_an_entry_larger_than_the_whole_memo_is_not_kept_and_evicts_nothing():
    memo: BoundedMemo[str] = BoundedMemo(max_entries=10, max_bytes=4 * ENTRY_OVERHEAD_BYTES)
    memo.put("a", "1", 0)
    assert memo.put("huge", "x", 10 * ENTRY_OVERHEAD_BYTES) is False
    assert memo.get("huge") is None and memo.get("a") == "1"


def test_the_least_recently_used_entry_goes_first():
    memo: BoundedMemo[str] = BoundedMemo(max_entries=2, max_bytes=2**20)
    memo.put("a", "1", 0)
    memo.put("b", "2", 0)
    memo.get("a")
    memo.put("c", "3", 0)
    assert memo.get("b") is None and memo.get("a") == "1" and memo.get("c") == "3"


@pytest.mark.parametrize("max_entries, max_bytes", [(0, 10), (10, 0)])
def test_bounds_below_one_are_refused(max_entries, max_bytes):
    with pytest.raises(ValueError, match="bounds must be >= 1"):
        BoundedMemo(max_entries, max_bytes)


def test_rotations_of_one_node_list_keep_at_most_a_bounded_number_of_state_lists(service):
    names = NODES + [f"stranger-{i}" for i in range(3 * server.MAX_ROTATIONS)]
    p = pod({"gpuplace.io/vram": "20Gi"})
    for shift in range(len(names)):  # the same list, rotated by each offset in turn
        got = filter_(service, p, names[shift:] + names[:shift])
        assert got["NodeNames"]
        assert len(service._node_list.states) <= server.MAX_ROTATIONS


def test_full_node_objects_with_ever_new_inventories_keep_a_bounded_number_of_class_verdicts(service, monkeypatch):
    from scheduler_extender.served import grouped as engine_module
    from tests.factories import example_inventory

    monkeypatch.setattr(engine_module, "MEMO_CLASSES", 50)
    p = pod({"gpuplace.io/vram": "20Gi"})
    for i in range(200):  # each request a node the source does not know, with an inventory never seen before
        inv = example_inventory("gpu-4090-0")
        inv["nodeName"] = name = f"forged-{i}"
        inv["gpus"][0]["memoryMiB"] = 24564 - i  # a class of its own
        node = {"metadata": {"name": name, "annotations": {"gpuplace.io/inventory": json.dumps(inv)}}}
        got = service.filter(parse_extender_args(json.dumps({"Pod": p, "Nodes": {"items": [node]}}).encode()))
        assert [n["metadata"]["name"] for n in got["Nodes"]["items"]] == [name]
    sizes = [len(classes) for classes, _ in service.engine._memo.values()]
    assert sizes and max(sizes) <= 50


def cluster_mode(service):
    """``service`` wired as the extender runs in cluster mode: the learned workload fed by the
    pending-pods watch (``cli._start_pending_watch``), not by requests."""
    from scheduler_extender.cluster.pending import PendingGpuPods

    pending = PendingGpuPods(on_new=service.observe_pod)
    service.learn_from_requests = False
    return pending


def test_in_cluster_mode_forged_filter_requests_do_not_move_the_learned_workload(service):
    cluster_mode(service)
    for i in range(300):  # each with a uid of its own, as 6,000 fake calls once moved a real pod's score
        filter_(service, versioned(pod({"gpuplace.io/vram": "70Gi"}, gpus=8, name=f"fake-{i}"), uid=f"fake-{i}"))
    assert service.workload._count == 0
    assert service.workload_profile().shapes == ()


def test_in_cluster_mode_each_waiting_gpu_pod_counts_once_from_the_api_servers_view(service):
    pending = cluster_mode(service)
    pods = [versioned(pod({"gpuplace.io/vram": "20Gi"}, name=f"p{i}"), uid=f"uid-{i}") for i in range(5)]
    pending.replace_pods(pods)
    for p in pods:  # the same pods again: a MODIFIED event each, then a relist
        pending.apply_pod_event("MODIFIED", p)
    pending.replace_pods(pods)
    assert service.workload._count == 5
    pending.apply_pod_event("ADDED", versioned(pod({"gpuplace.io/vram": "20Gi"}, name="p5"), uid="uid-5"))
    assert service.workload._count == 6


def test_in_static_mode_the_pods_filter_sees_are_learned(service):
    for i in range(3):
        filter_(service, versioned(pod({"gpuplace.io/vram": "20Gi"}, name=f"p{i}"), uid=f"uid-{i}"))
    assert service.workload._count == 3
