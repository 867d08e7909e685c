"""GPUs shared by the device plugin's time-slicing or MPS replicas, budgeted by VRAM (core.sharing)."""

from __future__ import annotations

import json

import pytest

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.policy import SharingSettings, load_policy
from scheduler_extender.core.sharing import GpuSharing, node_gpu_sharing, sharing_labels
from scheduler_extender.served.grouped import GroupedEngine
from tests.factories import gpu, inventory, pod

CAT = default_catalog()
ENGINE = Engine()
RTX_4090 = dict(name="NVIDIA GeForce RTX 4090", memory_mib=24564)  # 24 GiB, nvidia-smi's FB memory total


def node_obj(name, gpus, *, strategy="time-slicing", replicas=4, labels=True, allocatable=None):
    inv = inventory(name, gpus)
    meta = {"name": name, "annotations": {"gpuplace.io/inventory": json.dumps(inv)}, "labels": {}}
    if labels and strategy is not None:
        meta["labels"] = {"nvidia.com/gpu.sharing-strategy": strategy, "nvidia.com/gpu.replicas": str(replicas)}
    count = allocatable if allocatable is not None else len(gpus) * (replicas if strategy else 1)
    return {"metadata": meta, "status": {"allocatable": {"nvidia.com/gpu": str(count), "cpu": "64", "memory": "512Gi"}}}


def bound(p, node):
    p = json.loads(json.dumps(p))
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": "Running"}
    return p


def pod_vram(p, memory_bytes):
    return ENGINE.vram_need_bytes(p, memory_bytes)


def cluster(*nodes):
    c = ClusterCache(CAT, pod_vram)
    c.replace_nodes(list(nodes))
    c.replace_pods([])
    return c


def inference(name, vram="7Gi", **annotations):
    return pod({"gpuplace.io/vram": vram, "gpuplace.io/workload": "inference", **annotations}, name=name)


def verdict(c, p, node="ts"):
    job = ENGINE.job(p)
    return ENGINE.filter(job, [c.state(node)], None)[0]


# ---- how a node shares its GPUs -------------------------------------------------------------------

@pytest.mark.parametrize("labels, allocatable, gpus, expected", [
    ({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}, {"nvidia.com/gpu": 4}, 1,
     ("time-slicing", 4)),
    ({"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "10"}, {"nvidia.com/gpu": 80}, 8, ("mps", 10)),
    ({"nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gpu.replicas": "1"}, {"nvidia.com/gpu": 8}, 8, None),
    ({}, {"nvidia.com/gpu": 16}, 4, ("time-slicing", 4)),   # no GFD: a whole multiple of the GPUs is read as replicas
    ({}, {"nvidia.com/gpu": 3}, 4, None),                   # fewer than the GPUs: some unhealthy or lagging, not shared
    ({}, {"nvidia.com/gpu": 6}, 4, None),                   # not a whole multiple
    ({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}, {"nvidia.com/gpu": 4}, 0,
     None),                                                 # MIG devices: not budgeted
])
def test_a_nodes_sharing_is_read_from_gfd_labels_else_from_allocatable(labels, allocatable, gpus, expected):
    got = node_gpu_sharing(sharing_labels({"metadata": {"labels": labels}}), allocatable, gpus)
    assert (None if got is None else (got.strategy, got.replicas)) == expected


# ---- time-slicing ------------------------------------------------------------------------------

def test_three_7gib_pods_share_a_24gib_time_sliced_gpu_and_a_fourth_is_refused_with_a_vram_reason():
    c = cluster(node_obj("ts", [gpu(0, **RTX_4090)], replicas=4))
    for i in range(3):
        p = inference(f"infer-{i}")
        assert verdict(c, p).passed, verdict(c, p).reason
        c.apply_pod_event("ADDED", bound(p, "ts"))
    fourth = verdict(c, inference("infer-3"))
    assert not fourth.passed and not fourth.unresolvable
    assert [r.criterion for r in fourth.rejections] == ["vram"]
    assert fourth.reason.startswith("GPU 0: 3 GiB of 24 GiB VRAM left (3 pods share it) < 7 GiB needed")
    assert "time-slicing, 4 replicas per GPU" in fourth.reason
    assert verdict(c, inference("small-one", vram="2Gi")).passed  # what is left still fits a smaller pod


def test_the_gpu_with_the_fewest_replicas_in_use_is_the_one_the_plugin_gives_and_must_have_room():
    """NVIDIA's device plugin (``internal/rm/allocate.go``, default policy ``distributed``) gives
    the replica of a GPU with the fewest in use; among equals, any."""
    gpus = [gpu(0, **RTX_4090), gpu(1, **RTX_4090)]
    gpus[0]["allocatedTo"] = "default/a,default/b"
    c = cluster(node_obj("ts", gpus, replicas=4))
    c.replace_pods([bound(inference("a", "10Gi"), "ts"), bound(inference("b", "10Gi"), "ts")])
    alloc = c.state("ts").allocation
    assert alloc.shared == {gpus[0]["uuid"]: (10 * 2**30, 10 * 2**30)} and alloc.shared_unplaced == ()
    # GPU 0 has 4 GiB left, but the plugin gives GPU 1 (no replica in use): 20 GiB fits there.
    placed = verdict(c, inference("big", "20Gi"))
    assert placed.passed and [u.gpu_index for u in placed.chosen] == [1]
    gpus[1]["allocatedTo"] = "default/c,default/d"
    c = cluster(node_obj("ts", gpus, replicas=4))
    c.replace_pods([bound(inference(n, v), "ts") for n, v in (("a", "10Gi"), ("b", "10Gi"), ("c", "1Gi"), ("d", "1Gi"))])
    assert verdict(c, inference("fits", "3Gi")).passed
    refused = verdict(c, inference("too-big", "5Gi"))  # two in use on each: the plugin may hand out GPU 0
    assert refused.reason.startswith("GPU 0: 4 GiB of 24 GiB VRAM left (2 pods share it) < 5 GiB needed")
    assert "a replica of a GPU with the fewest in use" in refused.reason


def test_while_a_holder_is_on_an_unreported_gpu_every_gpu_with_a_free_replica_must_have_room():
    gpus = [gpu(0, **RTX_4090), gpu(1, **RTX_4090)]
    gpus[0]["allocatedTo"] = "default/a"
    c = cluster(node_obj("ts", gpus, replicas=4))
    c.replace_pods([bound(inference("a", "10Gi"), "ts"), bound(inference("b", "4Gi"), "ts")])
    assert c.state("ts").allocation.shared_unplaced == (4 * 2**30,)
    # b may be on GPU 1, so the counts are unknown: GPU 0 (10 + 4 GiB held) may be the one given.
    refused = verdict(c, inference("big", "12Gi"))
    assert refused.reason.startswith("GPU 0: 10 GiB of 24 GiB VRAM left"), refused.reason
    assert "any GPU with one free" in refused.reason


def test_a_pod_whose_need_is_unknown_counts_as_the_whole_gpu():
    c = cluster(node_obj("ts", [gpu(0, **RTX_4090)], replicas=4))
    unknown = pod({"gpuplace.io/class": "small"}, name="unknown")
    assert verdict(c, unknown).passed  # an empty GPU: it may have all of it
    c.apply_pod_event("ADDED", bound(unknown, "ts"))
    refused = verdict(c, inference("next", "1Gi"))
    assert "0 GiB of 24 GiB VRAM left (1 pods share it)" in refused.reason
    assert "the whole GPU needed (VRAM need unknown)" in verdict(c, pod({"gpuplace.io/class": "small"}, name="u2")).reason


def test_every_replica_in_use_is_a_resolvable_free_gpu_reason_and_debug_allocations_count_replicas():
    c = cluster(node_obj("ts", [gpu(0, **RTX_4090)], replicas=2))
    for i in range(2):
        c.apply_pod_event("ADDED", bound(inference(f"p{i}", "1Gi"), "ts"))
    assert c.snapshot()["nodes"]["ts"]["resources"]["nvidia.com/gpu"] == {"allocatable": 2, "held": 2, "free": 0}
    r = verdict(c, inference("third", "1Gi"))
    assert (r.passed, r.rejections[0].criterion, r.rejections[0].resolvable) == (False, "free-gpus", True)
    assert r.reason == "all 2 replicas in use (time-slicing, 2 replicas per GPU)"


def test_classes_that_may_not_share_and_pods_asking_for_several_replicas_are_refused_unresolvably():
    c = cluster(node_obj("ts", [gpu(0, **RTX_4090), gpu(1, **RTX_4090)], replicas=4))
    medium = verdict(c, inference("medium", "22Gi"))  # above small's 20 GiB: class medium, shareGpus false
    assert medium.unresolvable and "class medium may not share a GPU (policy shareGpus)" in medium.reason
    two = verdict(c, pod({"gpuplace.io/vram": "4Gi", "gpuplace.io/class": "small"}, gpus=2, name="two"))
    assert two.unresolvable and "2 replicas give no more VRAM than one" in two.reason


# ---- MPS ---------------------------------------------------------------------------------------

def test_under_mps_a_pod_fits_if_its_need_fits_one_replicas_limit_whatever_the_others_use():
    c = cluster(node_obj("ts", [gpu(0, **RTX_4090)], strategy="mps", replicas=4))
    assert verdict(c, inference("fits", "5Gi")).passed
    too_big = verdict(c, inference("too-big", "7Gi"))
    assert too_big.unresolvable and too_big.reason == (
        "6 GiB VRAM per MPS replica (the GPU's / 4) < 7 GiB needed (gpuplace.io/vram)")
    for i in range(3):
        c.apply_pod_event("ADDED", bound(inference(f"p{i}", "6Gi"), "ts"))
    assert verdict(c, inference("last", "5Gi")).passed  # each replica's memory is its own


# ---- whole GPUs and the equivalence layer -----------------------------------------------------------

def test_a_node_with_whole_gpus_is_unchanged():
    c = cluster(node_obj("ts", [gpu(0, **RTX_4090)], strategy=None))
    assert c.state("ts").view.sharing is None
    c.apply_pod_event("ADDED", bound(inference("a"), "ts"))
    assert "0 of 1 eligible GPUs free" in verdict(c, inference("b")).reason


def test_the_grouped_filter_tells_shared_nodes_apart_by_what_their_gpus_hold():
    nodes = [node_obj(f"ts-{i}", [gpu(0, **RTX_4090)], replicas=4) for i in range(4)]
    c = cluster(*nodes)
    c.apply_pod_event("ADDED", bound(inference("a", "10Gi"), "ts-1"))
    c.apply_pod_event("ADDED", bound(inference("b", "20Gi"), "ts-2"))
    c.apply_pod_event("ADDED", bound(inference("c", "10Gi"), "ts-3"))
    states = [c.state(f"ts-{i}") for i in range(4)]
    engine = GroupedEngine()
    job = engine.job(inference("new", "12Gi"))
    grouped = engine.filter_grouped(job, states, None)
    got = [grouped.results[g].passed for g in grouped.group_of]
    assert got == [r.passed for r in engine.filter(job, states, None)] == [True, True, False, True]
    assert grouped.group_of[1] == grouped.group_of[3] != grouped.group_of[0]
    assert states[0].view.sharing == GpuSharing("time-slicing", 4, states[0].view.sharing.source)


def test_among_shared_nodes_the_score_fills_the_replicas_already_in_use_first():
    c = cluster(node_obj("ts-0", [gpu(0, **RTX_4090)]), node_obj("ts-1", [gpu(0, **RTX_4090)]))
    c.apply_pod_event("ADDED", bound(inference("a", "4Gi"), "ts-1"))
    states = [c.state("ts-0"), c.state("ts-1")]
    job = ENGINE.job(inference("new", "4Gi"))
    scores = ENGINE.score(job, states, ENGINE.filter(job, states, None))
    assert scores["ts-1"].components["packing"] > scores["ts-0"].components["packing"]
    assert scores["ts-1"].value > scores["ts-0"].value  # the unrounded score, which breaks ties of the 0-10 integer


# ---- what the device plugin and the agent may disagree on, and hand-made input ------------------

def test_replicas_are_not_guessed_from_allocatable_while_the_agent_and_the_plugin_may_disagree_on_health():
    # 4 GPUs x 4 replicas; the plugin already dropped GPU 3 (12 advertised) while the agent has not
    assert node_gpu_sharing(sharing_labels({"metadata": {"labels": {}}}), {"nvidia.com/gpu": 12}, 4, all_healthy=False) is None
    assert node_gpu_sharing(sharing_labels({"metadata": {"labels": {}}}), {"nvidia.com/gpu": 16}, 4, all_healthy=True).replicas == 4
    c = cluster(node_obj("n", [gpu(0, **RTX_4090), gpu(1, **RTX_4090, healthy=False)], strategy=None))
    assert c.state("n").view.sharing is None  # 2 advertised for 2 GPUs with one unhealthy: not shared
    # the replicas label alone (older GFD wrote it only for time-slicing) is time-slicing
    got = node_gpu_sharing(sharing_labels({"metadata": {"labels": {"nvidia.com/gpu.replicas": "3"}}}), {"nvidia.com/gpu": 9}, 3, False)
    assert (got.strategy, got.replicas) == ("time-slicing", 3)


def test_an_inventory_claiming_more_gpus_than_the_replicas_advertised_is_refused():
    c = cluster(node_obj("ts", [gpu(k, **RTX_4090) for k in range(4)], replicas=4, allocatable=4))
    assert c.state("ts").view is None
    assert "inventory claims 16 healthy nvidia.com/gpu, but the Node's status.allocatable has 4" in c.state("ts").inventory_error


def test_a_pod_holding_two_replicas_of_one_gpu_counts_twice_in_replicas_and_vram():
    g = [gpu(0, **RTX_4090)]
    g[0]["allocatedTo"] = "default/two"
    c = cluster(node_obj("ts", g, replicas=4))
    c.replace_pods([bound(pod({"gpuplace.io/vram": "8Gi", "gpuplace.io/class": "small"}, gpus=2, name="two"), "ts")])
    alloc = c.state("ts").allocation
    assert len(alloc.shared[g[0]["uuid"]]) + len(alloc.shared_unplaced) == 2
    assert c.snapshot()["nodes"]["ts"]["resources"]["nvidia.com/gpu"]["held"] == 2
    assert "GPU 0: 8 GiB of 24 GiB VRAM left" in verdict(c, inference("new", "9Gi")).reason


def test_a_name_repeated_in_allocated_to_counts_once():
    g = [gpu(0, **RTX_4090), gpu(1, **RTX_4090)]
    g[0]["allocatedTo"] = ",".join(["default/a"] * 4)
    g[1]["allocatedTo"] = "default/b"
    c = cluster(node_obj("ts", g, replicas=4))
    c.replace_pods([bound(inference("a", "20Gi"), "ts"), bound(inference("b", "1Gi"), "ts")])
    assert c.state("ts").allocation.shared == {g[0]["uuid"]: (20 * 2**30,), g[1]["uuid"]: (2**30,)}
    # One replica in use on each (four would have left GPU 0 none, and GPU 1 the plugin's only
    # choice): GPU 0 may be given, and has only 4 GiB.
    refused = verdict(c, inference("new", "10Gi"))
    assert refused.reason.startswith("GPU 0: 4 GiB of 24 GiB VRAM left (1 pods share it)")


@pytest.mark.parametrize("value", ["\u00b2", "\u0664", "1" * 7, "-2", " 4", "4.0", ""])
def test_a_replicas_label_that_is_no_plain_number_is_not_read(value):
    assert node_gpu_sharing(sharing_labels({"metadata": {"labels": {"nvidia.com/gpu.sharing-strategy": "time-slicing",
                                                     "nvidia.com/gpu.replicas": value}}}), {"nvidia.com/gpu": 1}, 1) is None


def test_gpu_metrics_show_a_shared_gpu_allocated_while_a_pod_holds_a_replica():
    from scheduler_extender.cluster.cluster_metrics import unit_states
    g = [gpu(0, **RTX_4090), gpu(1, **RTX_4090)]
    g[1]["allocatedTo"] = "default/a"
    c = cluster(node_obj("ts", g, replicas=2))
    c.replace_pods([bound(inference("a", "1Gi"), "ts")])
    assert unit_states(c.state("ts")) == {g[0]["uuid"]: "free", g[1]["uuid"]: "allocated"}


def test_a_shared_gpu_nodes_gfd_product_label_names_the_model_without_its_shared_suffix():
    from scheduler_extender.core.gfd import inventory_from_labels
    inv = inventory_from_labels("n", {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090-SHARED",
                                      "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "24564"})
    assert CAT.resolve_driver_name(inv.gpus[0].name).id == "rtx-4090"


# ---- a full Node sent in the request is read as the cache reads it -----------------------------

def _from_request(node):
    """The state of a Node that arrives in a request and is not in the source (static mode with
    ``nodeCacheCapable: false``, or cluster mode before the watch has it)."""
    from scheduler_extender.cluster.sources import ClusterSource
    empty = ClusterCache(CAT, pod_vram)
    empty.replace_nodes([])
    empty.replace_pods([])
    return ClusterSource(empty, CAT).states([node["metadata"]["name"]], [node])[0]


@pytest.mark.parametrize("strategy, replicas", [("mps", 4), ("time-slicing", 4), (None, 1)])
def test_a_full_node_in_the_request_is_budgeted_exactly_as_the_same_node_known_to_the_cache(strategy, replicas):
    node = node_obj("ts", [gpu(0, **RTX_4090)], strategy=strategy, replicas=replicas)
    known, sent = cluster(node).state("ts"), _from_request(node)
    assert sent.view is not None and sent.view.sharing == known.view.sharing
    for p in (inference("small-20", vram="20Gi"), inference("small-5", vram="5Gi"),
              inference("medium", vram="20Gi", **{"gpuplace.io/class": "medium"})):
        job = ENGINE.job(p)
        assert ENGINE.filter(job, [sent], None)[0] == ENGINE.filter(job, [known], None)[0]


def test_a_full_node_labelled_mps_refuses_a_need_beyond_one_replica_and_a_class_that_may_not_share():
    sent = _from_request(node_obj("ts", [gpu(0, **RTX_4090)], strategy="mps", replicas=4))
    big = ENGINE.filter(ENGINE.job(inference("a", vram="20Gi")), [sent], None)[0]
    assert not big.passed and "VRAM per MPS replica (the GPU's / 4) < 20 GiB needed" in big.reason
    medium = ENGINE.filter(ENGINE.job(inference("b", vram="20Gi", **{"gpuplace.io/class": "medium"})), [sent], None)[0]
    assert not medium.passed and "may not share a GPU" in medium.reason


def test_holders_a_full_node_names_count_as_the_whole_gpu_since_their_needs_are_unknown_there():
    g = [gpu(0, **RTX_4090)]
    g[0]["allocatedTo"] = "default/a"
    sent = _from_request(node_obj("ts", g, strategy="time-slicing", replicas=4))
    assert sent.allocation.shared == {g[0]["uuid"]: (None,)}
    got = ENGINE.filter(ENGINE.job(inference("b", vram="5Gi")), [sent], None)[0]
    assert not got.passed and "GPU 0: 0 GiB of 24 GiB VRAM left (1 pods share it)" in got.reason


def test_policy_replica_choice_any_makes_every_gpu_with_a_free_replica_hold_the_need():
    """For a device plugin configured to pack (or any allocation policy): ``sharing.replicaChoice: any``."""
    gpus = [gpu(0, **RTX_4090), gpu(1, **RTX_4090)]
    gpus[0]["allocatedTo"] = "default/a,default/b"
    c = cluster(node_obj("ts", gpus, replicas=4))
    c.replace_pods([bound(inference("a", "10Gi"), "ts"), bound(inference("b", "10Gi"), "ts")])
    assert verdict(c, inference("big", "20Gi")).passed
    policy = load_policy(None)
    policy = policy.model_copy(update={"sharing": SharingSettings(replicaChoice="any")})
    engine = Engine(policy, CAT)
    refused = engine.filter(engine.job(inference("big", "20Gi")), [c.state("ts")], None)[0]
    assert refused.reason.startswith("GPU 0: 4 GiB of 24 GiB VRAM left"), refused.reason
    assert "any GPU with one free" in refused.reason
