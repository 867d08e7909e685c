"""The fragmentation score component and the learned target workload (table-driven scenarios)."""

import dataclasses
import json

import pytest

from node_agent.inventory import parse_inventory
from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.devices import NodeAllocation, NodeState, build_node_view
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.requirements import pod_host_requests
from scheduler_extender.core.score import fragmentation_delta
from scheduler_extender.core.workload import (
    DemandShape, WorkloadTracker, demand_shape, profile_of,
)
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.cluster.sources import ClusterSource, StaticSource
from scheduler_extender.service.wire import parse_extender_args
from tests.factories import EXAMPLES, example_inventory, gpu, inventory, pod

CAT = default_catalog()
ENGINE = Engine()
GIB = 2**30
T4 = dict(name="Tesla T4", memory_mib=15360)
A10 = dict(name="NVIDIA A10", memory_mib=23028)
GPU = "nvidia.com/gpu"


def node(name, spec, n, *, held=0, cpu=None, mem_gib=None):
    inv = parse_inventory(inventory(name, [gpu(i, **spec) for i in range(n)]))
    view = build_node_view(inv, CAT)
    alloc = NodeAllocation(held={u.uuid: "default/other" for u in view.units(GPU)[:held]})
    return NodeState(name, view, alloc, cpu_milli_free=cpu,
                     memory_bytes_free=None if mem_gib is None else mem_gib * GIB)


def host_pod(gpus=1, cpu="4", memory="16Gi", annotations=None):
    p = pod(annotations, gpus=gpus)
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu, "memory": memory}
    return p


def decide(p, states, workload):
    job = ENGINE.job(p)
    results = ENGINE.filter(job, states, None)
    return job, results, ENGINE.score(job, states, results, workload)


UNCONSTRAINED = DemandShape(GPU, 1, 4000, 16 * GIB)
T4_ONLY = DemandShape(GPU, 1, 4000, 16 * GIB, allowed_models=frozenset({"t4"}))
BIG_HOST = DemandShape(GPU, 1, 16000, 64 * GIB)


@pytest.mark.parametrize("scenario, mix, nodes, expected_best", [
    # (a) an unconstrained pod leaves the model that constrained pods need to them
    ("t4 kept for t4-only pods", {UNCONSTRAINED: 1, T4_ONLY: 3},
     [node("t4", T4, 2), node("a10", A10, 2)], "a10"),
    # (b) a node whose CPU runs out while its GPUs are still free strands them
    ("cpu would run out before gpus", {BIG_HOST: 1},
     [node("tight", A10, 2, cpu=18000, mem_gib=256), node("roomy", A10, 2, cpu=64000, mem_gib=256)], "roomy"),
    ("memory would run out before gpus", {BIG_HOST: 1},
     [node("tight", A10, 2, cpu=64000, mem_gib=70), node("roomy", A10, 2, cpu=64000, mem_gib=256)], "roomy"),
    # the last free GPU of a half-used node first: breaking a free pair strands a GPU for 2-GPU pods
    ("keep free pairs for 2-gpu pods", {UNCONSTRAINED: 1, DemandShape(GPU, 2, 4000, 16 * GIB): 1},
     [node("half", A10, 2, held=1, cpu=64000, mem_gib=256), node("empty", A10, 2, cpu=64000, mem_gib=256)], "half"),
])
def test_fragmentation_prefers_the_node_whose_free_gpus_stay_usable(scenario, mix, nodes, expected_best):
    _, results, scores = decide(host_pod(), nodes, profile_of(mix))
    assert all(r.passed for r in results), scenario
    frag = {n: s.components["fragmentation"] for n, s in scores.items()}
    assert frag[expected_best] == 1.0, (scenario, frag)
    assert all(v < 1.0 for n, v in frag.items() if n != expected_best), (scenario, frag)


def test_equally_fragmenting_nodes_are_scored_as_without_the_component_so_cost_picks_the_cheaper():
    mix = {UNCONSTRAINED: 1}
    states = [node("a10", A10, 2, cpu=64000, mem_gib=256), node("t4", T4, 2, cpu=64000, mem_gib=256)]
    _, _, scores = decide(host_pod(), states, profile_of(mix))
    _, _, plain = decide(host_pod(), states, None)
    assert all("fragmentation" not in s.components for s in scores.values())
    assert {n: s.score for n, s in scores.items()} == {n: s.score for n, s in plain.items()}
    assert scores["t4"].score > scores["a10"].score  # T4 is the cheaper GPU


@pytest.mark.parametrize("workload", [None, profile_of({})])
def test_without_a_learned_workload_the_component_does_not_apply(workload):
    states = [node("t4", T4, 2, cpu=64000, mem_gib=256)]
    _, _, scores = decide(host_pod(), states, workload)
    assert "fragmentation" not in scores["t4"].components


def test_unknown_cpu_and_memory_are_not_checked_never_taken_as_zero():
    job = ENGINE.job(host_pod())
    state = node("unknown-host", A10, 2)  # cpu/memory None
    chosen = ENGINE.filter(job, [state], None)[0].chosen
    # BIG_HOST fits a node of unknown CPU/memory with one GPU left: no fragment is made.
    assert fragmentation_delta(job, state, chosen, profile_of({BIG_HOST: 1})) == 0.0
    known = node("known-host", A10, 2, cpu=16000, mem_gib=256)
    chosen = ENGINE.filter(job, [known], None)[0].chosen
    # 12 cores left < 16 requested: the GPU left free becomes a fragment.
    assert fragmentation_delta(job, known, chosen, profile_of({BIG_HOST: 1})) == 1.0


@pytest.mark.parametrize("mix, free_left, expected", [
    ({UNCONSTRAINED: 1}, 1, 0.0),                    # the next pod fits: no fragment
    ({T4_ONLY: 1}, 1, -1.0),                         # A10s were all fragments to T4-only pods; one fewer
    ({DemandShape(GPU, 2, 1000, GIB): 1}, 1, 1.0),   # a 2-GPU mix cannot use the one GPU left
])
def test_fragmentation_delta_is_the_change_in_expected_unusable_gpus(mix, free_left, expected):
    job = ENGINE.job(host_pod())
    state = node("a10", A10, free_left + 1, cpu=64000, mem_gib=256)
    chosen = ENGINE.filter(job, [state], None)[0].chosen
    assert fragmentation_delta(job, state, chosen, profile_of(mix)) == pytest.approx(expected)


def test_tracker_learns_shares_from_what_it_saw_and_forgets_old_pods():
    tracker = WorkloadTracker(half_life_pods=10, refresh_pods=1, min_pods=1)
    assert not tracker.profile()
    for _ in range(30):
        tracker.observe(T4_ONLY)
    for _ in range(30):
        tracker.observe(UNCONSTRAINED)
    shares = dict(tracker.profile().shapes)
    total = sum(shares.values())
    # 30 newer pods at a 10-pod half-life outweigh 30 older ones 2^3 : 1
    assert shares[UNCONSTRAINED] / total == pytest.approx(8 / 9, rel=0.01)
    assert tracker.profile().version == 60


def test_tracker_waits_for_enough_pods_and_counts_a_retried_pod_once():
    tracker = WorkloadTracker(min_pods=3, refresh_pods=1)
    for _ in range(5):
        tracker.observe(T4_ONLY, key="uid-1")  # kube-scheduler retrying one pending pod
    tracker.observe(UNCONSTRAINED, key="uid-2")
    assert not tracker.profile()
    tracker.observe(UNCONSTRAINED, key="uid-3")
    assert {s for s, _ in tracker.profile().shapes} == {T4_ONLY, UNCONSTRAINED}


def test_tracker_refreshes_its_snapshot_every_n_pods_and_keeps_it_immutable_between():
    tracker = WorkloadTracker(refresh_pods=5, min_pods=1)
    tracker.observe(UNCONSTRAINED)
    first = tracker.profile()
    for _ in range(3):
        tracker.observe(T4_ONLY)
    assert tracker.profile() is first and [s for s, _ in first.shapes] == [UNCONSTRAINED]
    tracker.observe(T4_ONLY)
    tracker.observe(T4_ONLY)
    assert tracker.profile() is not first and T4_ONLY in dict(tracker.profile().shapes)


def test_demand_shape_carries_the_pods_models_and_host_requests():
    job = ENGINE.job(host_pod(annotations={"gpuplace.io/gpu-models": "T4"}, cpu="1500m", memory="2Gi"))
    shape = demand_shape(job)
    assert shape == DemandShape(GPU, 1, 1500, 2 * GIB, frozenset({"t4"}), shape.denied_models)
    assert demand_shape(ENGINE.job(pod(gpus=None))) is None


@pytest.mark.parametrize("containers, init, expected", [
    ([{"cpu": "500m", "memory": "1Gi"}, {"cpu": "1", "memory": "512Mi"}], [], (1500, 1536 * 2**20)),
    ([{"cpu": "500m"}], [{"cpu": "2", "memory": "1Gi"}], (2000, 2**30)),
    ([{}], [], (None, None)),
])
def test_pod_host_requests_count_like_node_resources_fit(containers, init, expected):
    p = {"spec": {"containers": [{"name": f"c{i}", "resources": {"requests": r}} for i, r in enumerate(containers)],
                  "initContainers": [{"name": f"i{i}", "resources": {"requests": r}} for i, r in enumerate(init)]}}
    assert pod_host_requests(p) == expected


def _node_obj(name, cpu="64", memory="256Gi"):
    return {"metadata": {"name": name, "annotations": {"gpuplace.io/inventory": json.dumps(example_inventory(name))}},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": "4"}}}


def _bound(name, node, cpu, memory, gpus=None, phase="Running"):
    p = host_pod(cpu=cpu, memory=memory) if gpus else pod(None, gpus=None, name=name)
    p["metadata"]["name"] = name
    p["metadata"]["uid"] = f"uid-{name}"
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu, "memory": memory}
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": phase}
    return p


def test_cache_gives_allocatable_minus_every_bound_pods_requests_gpu_or_not():
    c = ClusterCache(CAT)
    c.replace_nodes([_node_obj("gpu-4090-0")])
    c.replace_pods([_bound("gpu-pod", "gpu-4090-0", "8", "32Gi", gpus=1), _bound("sidecar", "gpu-4090-0", "500m", "1Gi")])
    st = c.state("gpu-4090-0")
    assert (st.cpu_milli_free, st.memory_bytes_free) == (64000 - 8500, (256 - 33) * GIB)
    c.apply_pod_event("MODIFIED", _bound("sidecar", "gpu-4090-0", "500m", "1Gi", phase="Succeeded"))
    assert c.state("gpu-4090-0").cpu_milli_free == 64000 - 8000
    c.apply_node_event("MODIFIED", _node_obj("gpu-4090-0", cpu="32"))
    assert c.state("gpu-4090-0").cpu_milli_free == 32000 - 8000


def test_cache_leaves_cpu_and_memory_unknown_without_allocatable():
    c = ClusterCache(CAT)
    obj = _node_obj("gpu-4090-0")
    del obj["status"]
    c.replace_nodes([obj])
    c.replace_pods([_bound("gpu-pod", "gpu-4090-0", "8", "32Gi", gpus=1)])
    st = c.state("gpu-4090-0")
    assert (st.cpu_milli_free, st.memory_bytes_free) == (None, None)


def test_extender_learns_the_workload_from_the_pods_filter_sees_and_steers_by_it():
    service = ExtenderService(Engine(), StaticSource(EXAMPLES / "cluster", CAT))
    nodes = ["gpu-4090-0", "gpu-a6000-0"]

    def args(i):
        p = pod({"gpuplace.io/gpu-models": "RTX-4090"} if i % 2 else {}, name=f"p{i}")
        return parse_extender_args(json.dumps({"Pod": p, "NodeNames": nodes}).encode())

    assert not service.workload_profile()
    service.filter(args(0))
    service.filter(args(0))  # a retry of the same pod: counted once
    first = service.workload_profile()
    assert len(first.shapes) == 1
    for i in range(1, 200):
        service.filter(args(i))
    assert len(service.workload_profile().shapes) == 2
    scores = {s["Host"]: s["Score"] for s in service.prioritize(args(0))}
    # Half the pods seen may only use RTX 4090s: an unconstrained pod is steered to the A6000,
    # where cost alone would pick the cheaper 4090.
    assert scores["gpu-a6000-0"] > scores["gpu-4090-0"]
    plain = ExtenderService(Engine(), StaticSource(EXAMPLES / "cluster", CAT)).prioritize(args(0))
    assert {s["Host"]: s["Score"] for s in plain}["gpu-4090-0"] > {s["Host"]: s["Score"] for s in plain}["gpu-a6000-0"]


# ---- host stranding: the look-ahead over all of a node's free GPUs ---------------------------

LIGHT = DemandShape(GPU, 1, 2000, 8 * GIB)
HEAVY = DemandShape(GPU, 1, 14000, 8 * GIB)


@pytest.mark.parametrize("free, cpu, mem_gib, expected", [
    (4, 64000, 256, 0.0),    # 8 of the mean pod's CPU and 32 of its memory: all 4 GPUs fed
    (4, 30000, 256, 0.25),   # 30,000 / 8,000 mean millicores per GPU = 3.75 GPUs fed
    (4, 64000, 16, 2.0),     # 16 GiB / 8 GiB per GPU: 2 fed
    (4, None, 16, 2.0),      # unknown CPU is not checked, memory still is
    (4, None, None, 0.0),    # nothing known: nothing stranded
    (2, -1000, 256, 2.0),    # overcommitted CPU counts as none
    (0, 0, 0, 0.0),
])
def test_host_stranding_is_free_gpus_minus_those_the_free_cpu_and_memory_feed_at_the_mean_request(
        free, cpu, mem_gib, expected):
    profile = profile_of({LIGHT: 1, HEAVY: 1})
    assert profile.mean_request_per_device(GPU) == (8000, 8 * GIB)
    mem = None if mem_gib is None else mem_gib * GIB
    assert profile.host_stranding(GPU, free, cpu, mem) == pytest.approx(expected)


def test_mean_request_per_device_weighs_by_devices_and_share_and_skips_unknown_requests():
    profile = profile_of({DemandShape(GPU, 2, 8000, None): 1, DemandShape(GPU, 1, 2000, 4 * GIB): 1})
    # (8,000 + 2,000) millicores over (2 + 1) devices; memory only from the shape that gives it
    assert profile.mean_request_per_device(GPU) == (pytest.approx(10000 / 3), 4 * GIB)
    assert profile.mean_request_per_device("nvidia.com/mig-1g.10gb") == (None, None)


@pytest.mark.parametrize("pod_cpu, expected_best", [("14", "rich"), ("2", "poor")])
def test_cpu_heavy_pods_go_where_cpu_is_to_spare_and_light_ones_where_it_is_short(pod_cpu, expected_best):
    # The next pod fits both nodes either way, so FGD's one-pod check cannot tell them apart; the
    # look-ahead can: 3 GPUs left with 16 cores feed 2 mean pods (8 cores each), not 3.
    states = [node("poor", A10, 4, cpu=30000, mem_gib=256), node("rich", A10, 4, cpu=64000, mem_gib=256)]
    job, results, scores = decide(host_pod(cpu=pod_cpu, memory="8Gi"), states, profile_of({LIGHT: 1, HEAVY: 1}))
    assert {fragmentation_delta(job, s, r.chosen, profile_of({LIGHT: 1, HEAVY: 1}))
            for s, r in zip(states, results)} == {0.0}
    frag = {n: s.components["fragmentation"] for n, s in scores.items()}
    assert frag[expected_best] == 1.0 and min(frag.values()) < 1.0, frag


def test_a_stream_of_heavy_and_light_pods_fills_every_gpu_where_the_one_pod_check_strands_one():
    # Two 4-GPU nodes, one short of CPU. Ties go to the first node listed (as a fixed tie-break).
    # FGD alone sends the first heavy pod to the CPU-short node (the next pod still fits), light
    # pods then fill the other, and the last heavy pods leave a GPU there without CPU.
    workload = profile_of({LIGHT: 1, HEAVY: 1})
    cpu = {"poor": 30000, "rich": 64000}
    held = {"poor": 0, "rich": 0}
    order = ["14", "2", "2", "2", "2", "14", "14", "14"]
    for c in order:
        states = [node(n, A10, 4, held=held[n], cpu=cpu[n], mem_gib=256) for n in ("poor", "rich")]
        job, results, scores = decide(host_pod(cpu=c, memory="8Gi"), states, workload)
        passed = [r.node for r in results if r.passed and cpu[r.node] >= int(c) * 1000]  # + NodeResourcesFit
        assert passed, f"pod {c} cores unplaced with {held} GPUs held and {cpu} millicores free"
        best = max(passed, key=lambda n: (scores[n].score, n == "poor"))
        held[best] += 1
        cpu[best] -= int(c) * 1000
    assert held == {"poor": 4, "rich": 4}


def test_one_trip_ranks_ties_of_the_integer_score_by_the_other_components_not_by_fragmentation():
    """--filter-returns-best (NodeScore.best_rank): two T4 nodes that fragment differently by less
    than a score step tie, and kube-scheduler's own scores choose between them; a cheaper model
    within the same step still wins (the tie is broken by cost)."""
    states = [node("t4-free", T4, 4, cpu=64000, mem_gib=256), node("t4-used", T4, 4, held=2, cpu=64000, mem_gib=256)]
    workload = profile_of({UNCONSTRAINED: 50, DemandShape(GPU, 2, 8000, 32 * GIB): 1})
    _, _, scores = decide(host_pod(), states, workload)
    free, used = scores["t4-free"], scores["t4-used"]
    assert free.components["fragmentation"] != used.components["fragmentation"]
    assert free.value != used.value and free.score == used.score
    assert free.best_rank == used.best_rank
    states.append(node("a10", A10, 4, cpu=64000, mem_gib=256))
    _, _, scores = decide(host_pod(), states, workload)
    assert scores["t4-free"].best_rank > scores["a10"].best_rank  # the T4 is cheaper


# GPU shares (Job.gpu_milli, NodeAllocation.partly_free_milli): FGD's measure in thousandths.
HALF = DemandShape(GPU, 1, None, None, gpu_milli=500)
WHOLE = DemandShape(GPU, 1, None, None)


def shared_node(name, levels, spec=T4, milli=1000):
    """A node whose GPU j has ``levels[j]`` thousandths free (1000: wholly free, 0: taken), as a
    pod taking ``milli`` of a GPU sees it: the GPUs with less left are held (``Cluster.class_state``)."""
    inv = parse_inventory(inventory(name, [gpu(i, **spec) for i in range(len(levels))]))
    view = build_node_view(inv, CAT)
    units = view.units(GPU)
    partly = {u.uuid: f for u, f in zip(units, levels) if 0 < f < 1000}
    held = {u.uuid: "default/sharer" for u, f in zip(units, levels) if f < milli}
    return NodeState(name, view, NodeAllocation(held=held, partly_free_milli=partly))


@pytest.mark.parametrize("mix, levels, expected", [
    # whole-GPU pods cannot use what sharing pods left of a GPU: 300 thousandths are a fragment
    ({WHOLE: 1}, (300, 1000), 0.3),
    # half-GPU pods use a GPU with 500 left, not one with 300
    ({HALF: 1}, (300, 500), 0.3),
    # a shape that fits nowhere on the node: every free thousandth is a fragment
    ({DemandShape(GPU, 2, None, None): 1}, (300, 1000), 1.3),
    # weighted by the shapes' shares
    ({WHOLE: 1, HALF: 1}, (300, 600), 0.5 * 0.9 + 0.5 * 0.3),
])
def test_fragmentation_counts_the_free_share_of_gpus_too_small_for_each_shape(mix, levels, expected):
    from scheduler_extender.core.score import free_models
    state = shared_node("n", levels)
    _, free = free_models(state, GPU)
    assert profile_of(mix).fragmentation(GPU, free, None, None) == pytest.approx(expected)


def test_whole_devices_only_keep_the_measure_free_gpus_times_the_share_that_does_not_fit():
    profile = profile_of({WHOLE: 1, DemandShape(GPU, 4, None, None): 1})
    free = (("t4", 1000, 2),)
    assert profile.fragmentation(GPU, free, None, None) == pytest.approx(2 * profile.fit_share(GPU, free, None, None))
    assert profile.fit_share(GPU, free, None, None) == pytest.approx(0.5)


def test_a_sharing_pod_fills_a_partly_used_gpu_before_breaking_a_whole_one():
    """Under a workload of whole-GPU pods, half a GPU taken from a wholly free GPU leaves a
    fragment of 500; taking the 500 left of a half-used GPU removes one."""
    workload = profile_of({WHOLE: 3, HALF: 1})
    job = dataclasses.replace(ENGINE.job(pod(gpus=1)), gpu_milli=500)
    states = [shared_node("fresh", (1000, 1000), milli=500), shared_node("half-used", (500, 1000), milli=500)]
    results = ENGINE.filter(job, states, None)
    scores = ENGINE.score(job, states, results, workload)
    assert scores["half-used"].score > scores["fresh"].score
    assert fragmentation_delta(job, states[1], results[1].chosen, workload) < 0 < fragmentation_delta(
        job, states[0], results[0].chosen, workload)


def test_a_sharing_pod_is_given_the_gpu_with_the_least_share_left_that_holds_it():
    job = dataclasses.replace(ENGINE.job(pod(gpus=1)), gpu_milli=400)
    state = shared_node("n", (1000, 700, 450, 300), milli=400)
    [result] = ENGINE.filter(job, [state], None)
    assert [u.gpu_index for u in result.chosen] == [2]
    whole = ENGINE.job(pod(gpus=1))  # a whole-GPU pod gets a wholly free GPU
    assert [u.gpu_index for u in ENGINE.filter(whole, [shared_node("n", (1000, 700, 450, 300))], None)[0].chosen] == [0]


def test_states_that_differ_only_in_the_shares_left_are_not_one_equivalence_class():
    from scheduler_extender.served.equivalence import state_key
    a, b = shared_node("a", (500, 1000)), shared_node("b", (300, 1000))
    assert state_key(a, GPU) != state_key(b, GPU)
    assert state_key(a, GPU) == state_key(shared_node("c", (500, 1000)), GPU)


def test_demand_shape_carries_the_pods_gpu_share():
    job = dataclasses.replace(ENGINE.job(pod(gpus=1)), gpu_milli=250)
    shape = demand_shape(job)
    assert shape.gpu_milli == 250 and shape.devices == pytest.approx(0.25)


# ---- pods without GPUs (scheduler.extender.cpuOnlyPods) ----------------------------------------

FEEDS_FOUR = DemandShape(GPU, 1, 15000, 8 * GIB)  # four of these fill a 64-core node's four GPUs


def test_a_cpu_only_pod_goes_where_its_cpu_strands_no_free_gpu():
    job = ENGINE.job(host_pod(gpus=None, cpu="8", memory="1Gi"))
    assert job.req.resource is None
    states = [node("busy", T4, 4, held=4, cpu=64000, mem_gib=256), node("free", T4, 4, cpu=64000, mem_gib=256)]
    results = ENGINE.filter(job, states, None)
    assert all(r.passed and r.untouched for r in results)
    scores = ENGINE.score(job, states, results, profile_of({FEEDS_FOUR: 1}))
    # on "free", 56 cores would feed three 15-core GPU pods: one of its four GPUs stranded
    assert scores["busy"].score > scores["free"].score
    assert scores["busy"].components["fragmentation"] == 1.0 > scores["free"].components["fragmentation"]


def test_a_cpu_only_pod_that_strands_nothing_prefers_the_node_whose_gpus_are_in_use():
    job = ENGINE.job(host_pod(gpus=None, cpu="1", memory="1Gi"))
    states = [node("half", T4, 4, held=2, cpu=200000, mem_gib=512), node("free", T4, 4, cpu=200000, mem_gib=512)]
    scores = ENGINE.score(job, states, ENGINE.filter(job, states, None), profile_of({FEEDS_FOUR: 1}))
    assert scores["half"].components["fragmentation"] == scores["free"].components["fragmentation"]
    assert scores["half"].best_rank > scores["free"].best_rank


@pytest.mark.parametrize("workload", [None, profile_of({})])
def test_a_cpu_only_pod_scores_zero_everywhere_without_a_learned_workload(workload):
    job = ENGINE.job(host_pod(gpus=None, cpu="8", memory="1Gi"))
    states = [node("busy", T4, 4, held=4, cpu=64000), node("free", T4, 4, cpu=64000)]
    scores = ENGINE.score(job, states, ENGINE.filter(job, states, None), workload)
    assert {s.score for s in scores.values()} == {0}


def _cpu_only_service(best_only):
    c = ClusterCache(CAT)
    c.replace_nodes([_node_obj("gpu-4090-0"), _node_obj("gpu-4090-1")])
    # gpu-4090-0: all four GPUs held; gpu-4090-1: all free, 64 cores
    c.replace_pods([_bound(f"g{i}", "gpu-4090-0", "1", "1Gi", gpus=1) for i in range(4)])
    service = ExtenderService(Engine(), ClusterSource(c, CAT))
    service.filter_returns_best = best_only
    for i in range(20):  # learn a workload of 15-core one-GPU pods
        service.workload.observe(FEEDS_FOUR, key=f"w{i}")
    return service


def test_extender_filter_passes_a_cpu_only_pod_only_where_it_strands_no_gpu():
    service = _cpu_only_service(best_only=True)
    p = host_pod(gpus=None, cpu="8", memory="1Gi")
    out = service.filter(parse_extender_args(json.dumps({"Pod": p, "NodeNames": ["gpu-4090-0", "gpu-4090-1"]}).encode()))
    assert out["NodeNames"] == ["gpu-4090-0"]
    assert "CPU and memory would leave" in out["FailedNodes"]["gpu-4090-1"]
    scores = {s["Host"]: s["Score"] for s in _cpu_only_service(best_only=False).prioritize(
        parse_extender_args(json.dumps({"Pod": p, "NodeNames": ["gpu-4090-0", "gpu-4090-1"]}).encode()))}
    assert scores["gpu-4090-0"] > scores["gpu-4090-1"]


def test_extender_passes_a_cpu_only_pod_everywhere_before_it_has_learned_a_workload():
    service = _cpu_only_service(best_only=True)
    service.workload = WorkloadTracker()
    p = host_pod(gpus=None, cpu="8", memory="1Gi")
    out = service.filter(parse_extender_args(json.dumps({"Pod": p, "NodeNames": ["gpu-4090-0", "gpu-4090-1"]}).encode()))
    assert sorted(out["NodeNames"]) == ["gpu-4090-0", "gpu-4090-1"]


# ---- scarcity: the cluster's side of a model's demand ------------------------------------------

def test_scarcity_weighs_a_model_by_the_demand_only_it_and_few_others_can_serve():
    profile = profile_of({UNCONSTRAINED: 1, T4_ONLY: 1})
    scarcity = profile.scarcity(GPU, {"t4": 10.0, "a10": 90.0})
    # unconstrained: 0.5 x 100/100 on both; T4-only: 0.5 x 100/10 on T4 alone
    assert scarcity == {"t4": pytest.approx(5.5), "a10": pytest.approx(0.5)}
    assert profile_of({UNCONSTRAINED: 1}).scarcity(GPU, {"t4": 10.0, "a10": 90.0}) == {"t4": 1.0, "a10": 1.0}
    assert profile.scarcity(GPU, {}) == {} and profile.scarcity("amd.com/gpu", {"t4": 1.0}) == {}


def test_an_unconstrained_pod_leaves_the_scarce_model_to_the_pods_that_need_it_though_it_is_cheaper():
    # Every node keeps GPUs to spare, so the one-node measure sees no difference; the T4s are few
    # against the T4-only demand.
    states = [node(f"t4-{i}", T4, 4) for i in range(2)] + [node(f"a10-{i}", A10, 4) for i in range(8)]
    job = ENGINE.job(pod(gpus=1))
    results = ENGINE.filter(job, states, None)
    workload = profile_of({UNCONSTRAINED: 1, T4_ONLY: 1})
    scores = ENGINE.score(job, states, results, workload)
    assert scores["a10-0"].best_rank > scores["t4-0"].best_rank
    assert ENGINE.score(job, states, results, profile_of({UNCONSTRAINED: 1}))["t4-0"].best_rank > \
        ENGINE.score(job, states, results, profile_of({UNCONSTRAINED: 1}))["a10-0"].best_rank  # cost alone: T4


def test_supply_counts_each_state_for_the_nodes_it_stands_for_and_shares_left():
    from scheduler_extender.core.score import supply_of
    assert supply_of([(node("t", T4, 4, held=1), 3), (shared_node("s", (250, 1000)), 1)], GPU) == {"t4": 9 + 1.25}
