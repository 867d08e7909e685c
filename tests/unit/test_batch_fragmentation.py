"""The simulator's batch of fragmentation increases (``simulator.batch_fragmentation``) equals the
plain ``core.score.fragmentation_deltas`` float for float: on generated candidates (GPUs partly
taken by sharing pods, model lists, unknown CPU or memory, requests larger than what is free),
and, in ``test_served_equals_plain.py``, on every decision of a simulation run."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from node_agent.inventory import parse_inventory
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.devices import NodeAllocation, NodeState, build_node_view
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.filter import NodeResult
from scheduler_extender.core.score import fragmentation_deltas, free_models
from scheduler_extender.core.workload import DemandShape, profile_of
from scheduler_extender.simulator import batch_fragmentation
from tests.factories import gpu, inventory, pod

CAT = default_catalog()
ENGINE = Engine()
GIB = 2**30
GPU = "nvidia.com/gpu"
MODELS = {"t4": dict(name="Tesla T4", memory_mib=15360), "a10": dict(name="NVIDIA A10", memory_mib=23028),
          "a100": dict(name="NVIDIA A100-SXM4-80GB", memory_mib=81920)}

levels = st.sampled_from([0, 100, 250, 500, 600, 999, 1000, 1000, 1000])
nodes = st.tuples(st.sampled_from(sorted(MODELS)), st.lists(levels, min_size=1, max_size=8),
                  st.none() | st.integers(0, 96_000), st.none() | st.integers(0, 512) .map(lambda g: g * GIB))
model_sets = st.none() | st.frozensets(st.sampled_from(sorted(MODELS)), min_size=1)
shapes = st.builds(DemandShape, st.sampled_from([GPU, GPU, GPU, "nvidia.com/mig-1g.10gb"]), st.integers(1, 8), st.none() | st.sampled_from([1000, 4000, 32_000]),
                   st.none() | st.sampled_from([GIB, 16 * GIB, 200 * GIB]), model_sets,
                   st.frozensets(st.sampled_from(sorted(MODELS)), max_size=1), st.sampled_from([1000, 1000, 500, 250]))
workloads = st.dictionaries(shapes, st.floats(0.01, 10), min_size=1, max_size=12)


def _state(i: int, model: str, free_levels: list[int], cpu: int | None, mem: int | None) -> NodeState:
    """A node whose GPU j has ``free_levels[j]`` thousandths free: below 1000, sharing pods hold it."""
    view = build_node_view(parse_inventory(inventory(f"n{i}", [gpu(j, **MODELS[model]) for j in range(len(free_levels))])), CAT)
    units = view.units(GPU)
    partly = {u.uuid: f for u, f in zip(units, free_levels) if f < 1000}
    held = {u.uuid: "default/sharer" for u, f in zip(units, free_levels) if f < 1000}
    return NodeState(f"n{i}", view, NodeAllocation(held=held, partly_free_milli=partly),
                     cpu_milli_free=cpu, memory_bytes_free=mem)


@settings(max_examples=300, deadline=None)
@given(fleet=st.lists(nodes, min_size=1, max_size=12), mix=workloads, gpus=st.none() | st.integers(1, 4),
       milli=st.sampled_from([1000, 500, 300]), cpu=st.sampled_from(["1", "8", "64"]),
       memory=st.sampled_from(["1Gi", "64Gi", "1Ti"]),
       scarcity=st.none() | st.dictionaries(st.sampled_from(sorted(MODELS)), st.floats(0, 5), max_size=3))
def test_the_batch_equals_the_plain_loop_bit_for_bit(fleet, mix, gpus, milli, cpu, memory, scarcity):
    # gpus None: a pod without devices, whose increase is each node's host_only_delta.
    p = pod(gpus=gpus)
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu, "memory": memory}
    job = dataclasses.replace(ENGINE.job(p), gpu_milli=milli)
    workload = profile_of(mix)
    candidates = []
    for i, (model, free_levels, host_cpu, host_mem) in enumerate(fleet):
        state = _state(i, model, free_levels, host_cpu, host_mem)
        levels_free = free_models(state, GPU)[0]
        free = [u for u in state.view.units(GPU) if levels_free.get(u.uuid, 0) > 0]
        candidates.append((state, NodeResult(state.name, True, chosen=tuple(free[:gpus or 0]))))
    plain = fragmentation_deltas(job, candidates, workload, scarcity)
    batch = batch_fragmentation.batch_deltas(job, candidates, workload, scarcity)
    assert list(batch) == list(plain)
    assert [v.hex() for v in batch.values()] == [v.hex() for v in plain.values()]


def test_a_workload_without_shapes_of_the_pods_resource_measures_no_fragmentation_only_host_stranding():
    job = ENGINE.job(pod(gpus=1))
    state = _state(0, "t4", [1000, 1000], 4000, 64 * GIB)
    mig_only = profile_of({DemandShape("nvidia.com/mig-1g.10gb", 1, 16_000, 16 * GIB): 1})
    candidates = [(state, NodeResult("n0", True, chosen=tuple(state.view.units(GPU)[:1])))]
    assert batch_fragmentation.batch_deltas(job, candidates, mig_only, None) == \
        fragmentation_deltas(job, candidates, mig_only, None) == {"n0": 0.0}
