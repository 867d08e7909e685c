"""GPU shares in the cluster, read as ``gpuplace simulate`` reads them: a pod on a time-sliced or MPS
GPU takes its VRAM need over the GPU's memory; a shared GPU's partly free share is what its
holders leave (``NodeAllocation.partly_free_milli``, which the score's fragmentation, scarcity and
packing read); ``gpuplace.io/gpu-fraction`` asks a share of the GPU's memory outright."""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import pytest

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.quantity import GIB
from scheduler_extender.core.score import free_models, share_taken
from scheduler_extender.core.sharing import MILLI, share_milli, shared_free_milli
from scheduler_extender.core.workload import DemandShape, WorkloadProfile, demand_shape
from tests.factories import gpu, inventory, pod

CAT = default_catalog()
ENGINE = Engine()
RTX_4090 = dict(name="NVIDIA GeForce RTX 4090", memory_mib=24564)
MEM = 24564 * 2**20


def gpu_unit(uuid, memory=MEM, healthy=True):
    return SimpleNamespace(uuid=uuid, memory_bytes=memory, healthy=healthy)


def test_a_holders_share_is_its_need_over_the_gpus_memory_rounded_up_and_unknown_is_all():
    assert share_milli(7 * GIB, MEM) == 292  # 7 GiB of 23.99 GiB
    assert share_milli(None, MEM) == MILLI
    assert share_milli(10 * MEM, MEM) == MILLI


def test_a_shared_gpus_free_share_is_what_its_holders_leave_and_unplaced_holders_go_where_most_is_left():
    gpus = [gpu_unit("g0"), gpu_unit("g1"), gpu_unit("g2", healthy=False)]
    free = shared_free_milli(gpus, {"g0": (7 * GIB, 7 * GIB)}, (7 * GIB,))
    assert free == {"g0": MILLI - 2 * 292, "g1": MILLI - 292}  # the unplaced one on the emptier GPU
    assert shared_free_milli(gpus, {"g0": (None,)}, ()) == {"g0": 0}


def node_obj(name, *, replicas=4, gpus=1):
    inv = inventory(name, [gpu(i, **RTX_4090) for i in range(gpus)],
                    observedAt=dt.datetime.now(dt.timezone.utc).isoformat())
    return {"metadata": {"name": name, "annotations": {"gpuplace.io/inventory": json.dumps(inv)},
                         "labels": {"nvidia.com/gpu.sharing-strategy": "time-slicing",
                                    "nvidia.com/gpu.replicas": str(replicas)}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus * replicas), "cpu": "64", "memory": "256Gi"}}}


def bound(p, node):
    p = json.loads(json.dumps(p))
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": "Running"}
    return p


def cluster(*nodes, pods=()):
    c = ClusterCache(CAT, ENGINE.vram_need_bytes)
    c.replace_nodes(list(nodes))
    c.replace_pods(list(pods))
    return c


def inference(name, **annotations):
    if "gpuplace.io/gpu-fraction" in annotations:
        # A share's VRAM is known only on the GPU, so the policy's rules cannot size it: a class
        # that may share (the default policy's small) is named (docs/operator-policy.md#shares).
        annotations.setdefault("gpuplace.io/class", "small")
    return pod({"gpuplace.io/workload": "inference", **annotations}, name=name)


def test_the_cache_gives_a_shared_gpu_the_share_its_holders_leave_and_the_score_reads_it():
    holders = [bound(inference(f"h{i}", **{"gpuplace.io/vram": "7Gi"}), "ts") for i in range(2)]
    c = cluster(node_obj("ts"), pods=holders)
    st = c.state("ts")
    uuid = st.view.units("nvidia.com/gpu")[0].uuid
    assert st.allocation.partly_free_milli == {uuid: MILLI - 2 * 292}
    levels, free = free_models(st, "nvidia.com/gpu")
    assert levels == {uuid: 416} and free == (("rtx-4090", 416, 1),)


def test_a_pod_on_a_shared_gpu_takes_its_need_over_the_gpus_memory_and_elsewhere_its_gpu_milli():
    c = cluster(node_obj("ts"))
    st = c.state("ts")
    unit = st.view.units("nvidia.com/gpu")[0]
    assert share_taken(ENGINE.job(inference("a", **{"gpuplace.io/vram": "7Gi"})), st, unit) == 292
    assert share_taken(ENGINE.job(inference("b", **{"gpuplace.io/gpu-fraction": "0.5"})), st, unit) == 500
    whole = ENGINE.job(inference("c", **{"gpuplace.io/vram": "7Gi"}))
    w = _whole_gpu_state()
    assert share_taken(whole, w, w.view.units("nvidia.com/gpu")[0]) == MILLI
    tenth = ENGINE.job(inference("d", **{"gpuplace.io/gpu-fraction": "0.1"}))
    assert share_taken(tenth, w, w.view.units("nvidia.com/gpu")[0]) == MILLI  # a GPU nobody shares: all of it


def _whole_gpu_state():
    from node_agent.inventory import parse_inventory
    from scheduler_extender.core.devices import NodeState, build_node_view
    return NodeState("w", build_node_view(parse_inventory(inventory("w", [gpu(0, **RTX_4090)])), CAT))


def test_fragmentation_on_shared_nodes_measures_shares_as_fgd_does():
    # Two time-sliced nodes; the learned workload expects half-GPU pods (gpu-fraction 0.5). A
    # 7 GiB pod (292 thousandths) on the GPU where 7 GiB is held leaves 416: no half fits there any
    # more, 416 thousandths become a fragment; on the empty GPU it leaves 708, where one still fits.
    # FGD's measure (and so gpuplace's) prefers the empty GPU. Counted whole, as before shares were
    # read in the cluster, both GPUs looked alike and fragmentation told them not apart.
    c = cluster(node_obj("used"), node_obj("empty"), pods=[bound(inference("h", **{"gpuplace.io/vram": "7Gi"}), "used")])
    half = ENGINE.job(inference("half", **{"gpuplace.io/gpu-fraction": "0.5"}))
    profile = WorkloadProfile(((demand_shape(half), 1.0),))
    job = ENGINE.job(inference("p", **{"gpuplace.io/vram": "7Gi"}))
    states = [c.state("used"), c.state("empty")]
    results = ENGINE.filter(job, states, None)
    assert all(r.passed for r in results)
    scores = ENGINE.score(job, states, results, profile)
    assert scores["empty"].components["fragmentation"] == 1.0
    assert scores["used"].components["fragmentation"] == pytest.approx(1 - 0.416)


# ---- gpuplace.io/gpu-fraction ---------------------------------------------------------------------

@pytest.mark.parametrize("value, milli", [("0.5", 500), ("0.25", 250), ("1", 1000), (".125", 125), ("0.3333", 334)])
def test_a_gpu_fraction_is_read_in_thousandths_rounded_up(value, milli):
    job = ENGINE.job(inference("f", **{"gpuplace.io/gpu-fraction": value}))
    assert not job.errors and job.req.gpu_fraction_milli == milli and job.gpu_milli == milli
    assert demand_shape(job).gpu_milli == milli  # the learned workload sees the share
    assert f"gpu-fraction {milli / 1000:g}" in job.describe()


@pytest.mark.parametrize("value", ["0", "1.5", "50%", "half", "-0.5", "0.1234567"])
def test_a_gpu_fraction_that_is_no_share_of_one_gpu_is_refused_naming_the_form(value):
    job = ENGINE.job(inference("f", **{"gpuplace.io/gpu-fraction": value}))
    assert [e.field for e in job.errors] == ["gpuplace.io/gpu-fraction"]
    assert "use a decimal above 0 and at most 1, e.g. 0.5 or 0.25" in str(job.errors[0])


def test_a_gpu_fraction_needs_a_request_of_one_gpu():
    job = ENGINE.job(pod({"gpuplace.io/gpu-fraction": "0.5"}, gpus=2))
    assert str(job.errors[0]) == "gpuplace.io/gpu-fraction: a share of one GPU needs a request of 1 nvidia.com/gpu, not 2 nvidia.com/gpu"


def test_time_sliced_gpus_take_gpu_fraction_pods_by_their_share_of_the_gpus_memory():
    c = cluster(node_obj("ts"))
    for i in range(2):
        p = inference(f"half-{i}", **{"gpuplace.io/gpu-fraction": "0.5"})
        assert ENGINE.filter(ENGINE.job(p), [c.state("ts")], None)[0].passed
        c.apply_pod_event("ADDED", bound(p, "ts"))
    third = ENGINE.filter(ENGINE.job(inference("half-2", **{"gpuplace.io/gpu-fraction": "0.5"})), [c.state("ts")], None)[0]
    assert not third.passed
    assert "GPU 0: 0 GiB of 24 GiB VRAM left (2 pods share it) < 12 GiB needed (gpuplace.io/gpu-fraction 0.5 of the GPU)" \
        in third.reason


def test_under_mps_a_gpu_fraction_beyond_one_replicas_limit_is_refused():
    node = node_obj("mps")
    node["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] = "mps"
    c = cluster(node)
    quarter = ENGINE.filter(ENGINE.job(inference("q", **{"gpuplace.io/gpu-fraction": "0.25"})), [c.state("mps")], None)[0]
    half = ENGINE.filter(ENGINE.job(inference("h", **{"gpuplace.io/gpu-fraction": "0.5"})), [c.state("mps")], None)[0]
    assert quarter.passed
    assert not half.passed and "VRAM per MPS replica (the GPU's / 4) < 12 GiB needed (gpuplace.io/gpu-fraction 0.5" in half.reason
